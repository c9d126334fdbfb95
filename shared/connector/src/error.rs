//! The connector crate's errors. Calls to an upstream never fail (their problems are
//! outcomes); only setting a connector up can.

/// Why a connector could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// The HTTP client could not be built (its TLS backend failed to initialise).
    #[error("cannot build the HTTP client for the connector")]
    Client {
        #[source]
        source: reqwest::Error,
    },
}
