//! `sluice-mcp-fixture`: the test notebook MCP server (`mcp_fixture.rs`) on stdio. A test
//! fixture of the connector's tests, not part of Sluice.

// Shared with the other side (stdio binary, HTTP tests): each uses a part.
#[allow(dead_code)]
#[path = "mcp_fixture.rs"]
mod mcp_fixture;

use rmcp::ServiceExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(path) = std::env::var_os("FIXTURE_PID") {
        std::fs::write(path, std::process::id().to_string())?;
    }
    let notebook = match std::env::var_os("FIXTURE_STATE") {
        Some(path) => mcp_fixture::Notebook::in_file(path.into()),
        None => mcp_fixture::Notebook::in_memory(),
    };
    let running = notebook.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
