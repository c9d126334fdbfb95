//! Failpoints at the boundaries where a crash or a delay changes Sluice's outcome, and clock
//! skew for fault runs. Without the `failpoints` feature every site compiles to nothing and
//! the `fail` crate is not linked: release builds carry none of it.
//!
//! * [`point!`]`("<service>.<step>.<pre|post>")` marks a site. The name must be one of
//!   [`POINTS`] (checked at compile time, with or without the feature). With the feature it is
//!   `fail::fail_point!`, except that the `return` action **aborts the process at once**
//!   ([`std::process::abort`]: SIGABRT, no destructor runs, nothing is flushed — a crash as
//!   `kill -9` would make it, at a known place). `sleep(ms)`, `delay(ms)`, `panic`, `pause`,
//!   `print`, `yield`, `off`, probabilities (`3%`) and counts (`2*`) work as in `fail`. `sleep`
//!   and `pause` block the thread they run on, a tokio worker included, as they do in `fail`.
//! * [`setup`] arms the sites named in `FAILPOINTS` (`name=actions;name=actions`) and refuses a
//!   name that is not a site of this build. Without the feature it refuses to start when
//!   `FAILPOINTS` or `SLUICE_FAULT_CLOCK_SKEW_MS` is set, so nobody runs a fault run against a
//!   build that silently ignores it.
//! * [`clock_skew`], [`clock_for`] and [`SkewedClock`] give each service its own clock offset
//!   from `SLUICE_FAULT_CLOCK_SKEW_MS` (`dispatcher=250,reconciler=-300`).
//!
//! The sites are listed, with what a crash or a delay at each tests, in the "Failpoints"
//! section of `docs/failure-modes.md`.

use std::fmt;
use std::sync::Arc;

use sluice_core::time::{Clock, SystemClock, Timestamp};
use thiserror::Error;

/// The variable [`setup`] reads the failpoint actions from (the `fail` crate's own name).
pub const FAILPOINTS_VAR: &str = "FAILPOINTS";

/// The variable [`clock_skew`] reads the per-service clock offsets from.
pub const CLOCK_SKEW_VAR: &str = "SLUICE_FAULT_CLOCK_SKEW_MS";

/// Whether this build has the failpoints compiled in.
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// The services a clock offset may be given to.
pub const SERVICES: [&str; 4] = ["producer", "dispatcher", "reconciler", "compensator"];

/// Every failpoint site, in the order of one effect's path. A [`point!`] with a name not here
/// does not compile, and a unit test checks that each name here has a site in the source.
pub const POINTS: &[&str] = &[
    // The producer's submission: the handler, the reservation, the dispatch request.
    "producer.submit.pre",
    "producer.reserve.pre",
    "producer.reserve.post",
    "producer.publish.pre",
    "producer.publish.post",
    "producer.submit.post",
    "producer.rollback.pre",
    "producer.rollback.post",
    // Ledger writes, in both ledgers (SQLite and CQL).
    "ledger.claim_key.pre",
    "ledger.claim_key.post",
    "ledger.reserve.pre",
    "ledger.reserve.post",
    "ledger.lease.pre",
    "ledger.lease.post",
    "ledger.finalize.pre",
    "ledger.finalize.post",
    "ledger.transition.pre",
    "ledger.transition.post",
    "ledger.audit_append.pre",
    "ledger.audit_append.post",
    "ledger.close_run.pre",
    "ledger.close_run.post",
    "ledger.purge.pre",
    "ledger.purge.post",
    // The bus, embedded or Kafka.
    "bus.publish.pre",
    "bus.publish.post",
    "bus.ack.pre",
    "bus.ack.post",
    // The consume loop every service runs, around each call of its handler.
    "consumer.handle.pre",
    "consumer.handle.post",
    // The dispatcher's handler.
    "dispatcher.lease.pre",
    "dispatcher.lease.post",
    "dispatcher.call.pre",
    "dispatcher.call.post",
    "dispatcher.finalize.pre",
    "dispatcher.finalize.post",
    "dispatcher.carry_out.pre",
    "dispatcher.carry_out.post",
    // The upstream calls, in the HTTP connector.
    "connector.dispatch.pre",
    "connector.dispatch.post",
    "connector.status_check.pre",
    "connector.status_check.post",
    "connector.compensate.pre",
    "connector.compensate.post",
    // The reconciler's handler and sweeps.
    "reconciler.claim.pre",
    "reconciler.claim.post",
    "reconciler.check.pre",
    "reconciler.check.post",
    "reconciler.write.pre",
    "reconciler.write.post",
    "reconciler.sweep_due.pre",
    "reconciler.sweep_due.post",
    "reconciler.sweep_republish.pre",
    "reconciler.sweep_republish.post",
    // The compensator's handler (rollback compensations and duplicate clean-ups).
    "compensator.claim.pre",
    "compensator.claim.post",
    "compensator.call.pre",
    "compensator.call.post",
    "compensator.write.pre",
    "compensator.write.post",
];

/// Whether `name` is in [`POINTS`]; `const` so [`point!`] checks its name at compile time.
#[doc(hidden)]
pub const fn listed(name: &str) -> bool {
    let mut i = 0;
    while i < POINTS.len() {
        if same(POINTS[i].as_bytes(), name.as_bytes()) {
            return true;
        }
        i += 1;
    }
    false
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Marks a failpoint site: `sluice_faults::point!("ledger.finalize.post");`. A statement that
/// fits any function, sync or async, whatever it returns. With the `failpoints` feature it runs
/// the action `FAILPOINTS` gave the site (`return` aborts the process); without it, nothing.
#[cfg(feature = "failpoints")]
#[macro_export]
macro_rules! point {
    ($name:literal) => {{
        const _: () = assert!(
            $crate::listed($name),
            concat!("failpoint \"", $name, "\" is not in sluice_faults::POINTS")
        );
        $crate::__hit($name);
    }};
}

/// Marks a failpoint site: `sluice_faults::point!("ledger.finalize.post");`. A statement that
/// fits any function, sync or async, whatever it returns. With the `failpoints` feature it runs
/// the action `FAILPOINTS` gave the site (`return` aborts the process); without it, nothing.
#[cfg(not(feature = "failpoints"))]
#[macro_export]
macro_rules! point {
    ($name:literal) => {{
        const _: () = assert!(
            $crate::listed($name),
            concat!("failpoint \"", $name, "\" is not in sluice_faults::POINTS")
        );
    }};
}

/// The body of [`point!`] with the feature on: a function, so the site's own return type never
/// meets `fail_point!`'s early `return`, which here is a crash and returns nothing.
#[cfg(feature = "failpoints")]
#[doc(hidden)]
pub fn __hit(name: &'static str) {
    fail::fail_point!(name, |_| crash(name));
}

/// Dies the way `kill -9` would, at a known place: no destructor, no flush, no unwinding. One
/// line on stderr (unbuffered) names the site for whoever reads the run's log.
#[cfg(feature = "failpoints")]
fn crash(name: &str) -> ! {
    use std::io::Write as _;
    let line = format!("sluice failpoint {name}: crash (abort)\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    std::process::abort()
}

/// A fault configuration that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FaultsError {
    #[error(
        "{var} is set, but this build has no failpoints: build it with the `failpoints` feature \
         (`cargo build -p sluice --features failpoints`), or unset {var}"
    )]
    NotCompiledIn { var: &'static str },
    #[error("{var} is not valid UTF-8")]
    NotUnicode { var: &'static str },
    #[error(
        "FAILPOINTS names {name:?}, which is no failpoint of this build \
         (see sluice_faults::POINTS or docs/failure-modes.md)"
    )]
    UnknownPoint { name: String },
    #[error("FAILPOINTS entry {entry:?} is not `name=actions`")]
    Malformed { entry: String },
    #[error("FAILPOINTS gives {name} the actions {actions:?}, which fail cannot use: {why}")]
    BadActions {
        name: String,
        actions: String,
        why: String,
    },
    #[error(
        "SLUICE_FAULT_CLOCK_SKEW_MS names {name:?}, which is not a service \
         (producer, dispatcher, reconciler, compensator)"
    )]
    UnknownService { name: String },
    #[error("SLUICE_FAULT_CLOCK_SKEW_MS entry {entry:?} is not `service=milliseconds`: {why}")]
    BadSkew { entry: String, why: String },
}

/// What [`setup`] armed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Armed {
    /// `(site, actions)` in the order `FAILPOINTS` gave them.
    pub points: Vec<(String, String)>,
    /// The clock offsets of `SLUICE_FAULT_CLOCK_SKEW_MS`.
    pub clock_skew: ClockSkew,
}

impl Armed {
    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && self.clock_skew.is_empty()
    }
}

/// Reads a variable; `None` when unset or empty.
fn var(name: &'static str) -> Result<Option<String>, FaultsError> {
    match std::env::var(name) {
        Ok(value) if value.trim().is_empty() => Ok(None),
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(FaultsError::NotUnicode { var: name }),
    }
}

/// Arms the failpoints `FAILPOINTS` names and checks `SLUICE_FAULT_CLOCK_SKEW_MS`; call it
/// first thing in `main`. A site name that is not in [`POINTS`], or actions `fail` cannot
/// parse, is an error (a typo would otherwise arm nothing and the run would prove nothing).
/// When something is armed, one line on stderr says what.
///
/// Without the `failpoints` feature: nothing to arm, and an error if either variable is set.
pub fn setup() -> Result<Armed, FaultsError> {
    let points = match var(FAILPOINTS_VAR)? {
        None => Vec::new(),
        Some(text) => {
            if !ENABLED {
                return Err(FaultsError::NotCompiledIn {
                    var: FAILPOINTS_VAR,
                });
            }
            let points = parse_failpoints(&text)?;
            for (name, actions) in &points {
                arm(name, actions)?;
            }
            points
        }
    };
    let armed = Armed {
        points,
        clock_skew: clock_skew()?,
    };
    if !armed.is_empty() {
        let points: Vec<String> = armed
            .points
            .iter()
            .map(|(name, actions)| format!("{name}={actions}"))
            .collect();
        eprintln!(
            "sluice-faults: failpoints armed [{}], clock skew [{}]",
            points.join("; "),
            armed.clock_skew
        );
    }
    Ok(armed)
}

/// Splits `name=actions;name=actions` and checks every name against [`POINTS`].
pub fn parse_failpoints(text: &str) -> Result<Vec<(String, String)>, FaultsError> {
    let mut points = Vec::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, actions)) = entry.split_once('=') else {
            return Err(FaultsError::Malformed {
                entry: entry.to_owned(),
            });
        };
        let (name, actions) = (name.trim(), actions.trim());
        if !listed(name) {
            return Err(FaultsError::UnknownPoint {
                name: name.to_owned(),
            });
        }
        if actions.is_empty() {
            return Err(FaultsError::Malformed {
                entry: entry.to_owned(),
            });
        }
        points.push((name.to_owned(), actions.to_owned()));
    }
    Ok(points)
}

#[cfg(feature = "failpoints")]
fn arm(name: &str, actions: &str) -> Result<(), FaultsError> {
    fail::cfg(name, actions).map_err(|why| FaultsError::BadActions {
        name: name.to_owned(),
        actions: actions.to_owned(),
        why,
    })
}

#[cfg(not(feature = "failpoints"))]
fn arm(_name: &str, _actions: &str) -> Result<(), FaultsError> {
    Ok(())
}

/// Per-service clock offsets in milliseconds (positive: the service's clock runs ahead).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClockSkew {
    offsets: Vec<(&'static str, i64)>,
}

impl ClockSkew {
    /// Parses `service=ms,service=ms` (services from [`SERVICES`], each at most once).
    pub fn parse(text: &str) -> Result<Self, FaultsError> {
        let mut offsets: Vec<(&'static str, i64)> = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |why: &str| FaultsError::BadSkew {
                entry: entry.to_owned(),
                why: why.to_owned(),
            };
            let (name, millis) = entry
                .split_once('=')
                .ok_or_else(|| bad("no `=` between the service and its offset"))?;
            let name = name.trim();
            let service = SERVICES
                .iter()
                .copied()
                .find(|service| *service == name)
                .ok_or_else(|| FaultsError::UnknownService {
                    name: name.to_owned(),
                })?;
            let millis: i64 = millis
                .trim()
                .parse()
                .map_err(|e: std::num::ParseIntError| bad(&e.to_string()))?;
            if offsets.iter().any(|(s, _)| *s == service) {
                return Err(bad("the service is given twice"));
            }
            offsets.push((service, millis));
        }
        Ok(Self { offsets })
    }

    /// The offset of `service`; 0 when none was given.
    pub fn offset_ms(&self, service: &str) -> i64 {
        self.offsets
            .iter()
            .find(|(s, _)| *s == service)
            .map_or(0, |(_, millis)| *millis)
    }

    /// No service has a non-zero offset.
    pub fn is_empty(&self) -> bool {
        self.offsets.iter().all(|(_, millis)| *millis == 0)
    }

    /// `clock` as `service` sees it.
    pub fn clock_of(&self, service: &str, clock: Arc<dyn Clock>) -> Arc<dyn Clock> {
        SkewedClock::wrap(clock, self.offset_ms(service))
    }
}

impl fmt::Display for ClockSkew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (service, millis)) in self.offsets.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{service}={millis}")?;
        }
        Ok(())
    }
}

/// The offsets of `SLUICE_FAULT_CLOCK_SKEW_MS`; none when it is unset. Without the
/// `failpoints` feature the variable is refused ([`FaultsError::NotCompiledIn`]), not ignored.
pub fn clock_skew() -> Result<ClockSkew, FaultsError> {
    match var(CLOCK_SKEW_VAR)? {
        None => Ok(ClockSkew::default()),
        Some(_) if !ENABLED => Err(FaultsError::NotCompiledIn {
            var: CLOCK_SKEW_VAR,
        }),
        Some(text) => ClockSkew::parse(&text),
    }
}

/// The system clock as `service` sees it under `SLUICE_FAULT_CLOCK_SKEW_MS`: for a service
/// binary, whose whole process (its ledger handle included) runs on this clock.
pub fn clock_for(service: &str) -> Result<Arc<dyn Clock>, FaultsError> {
    Ok(clock_skew()?.clock_of(service, Arc::new(SystemClock)))
}

/// Another clock moved by a fixed offset.
#[derive(Debug)]
pub struct SkewedClock {
    inner: Arc<dyn Clock>,
    offset_ms: i64,
}

impl SkewedClock {
    pub fn new(inner: Arc<dyn Clock>, offset_ms: i64) -> Self {
        Self { inner, offset_ms }
    }

    /// `inner` moved by `offset_ms`; `inner` itself when the offset is 0.
    pub fn wrap(inner: Arc<dyn Clock>, offset_ms: i64) -> Arc<dyn Clock> {
        if offset_ms == 0 {
            inner
        } else {
            Arc::new(Self::new(inner, offset_ms))
        }
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        self.inner.now().plus_millis(self.offset_ms)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use sluice_core::time::ManualClock;

    use super::*;

    fn workspace_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// Every `.rs` file under `dir`, skipping build output, hidden directories and this crate
    /// (whose documentation and tests name sites of their own).
    fn rust_files(dir: &Path, skip: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                let same_as_skip = path.canonicalize().ok() == skip.canonicalize().ok();
                if !same_as_skip {
                    rust_files(&path, skip, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    /// The names of the `point!("…")` sites in `text`, with anything else the macro was given.
    fn sites(text: &str) -> Vec<String> {
        const MACRO: &str = "point!(";
        let mut found = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(MACRO) {
            let before = rest[..at].chars().next_back();
            let after = &rest[at + MACRO.len()..];
            rest = after;
            // `fail_point!(` and the like are not ours.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let argument = after.trim_start();
            let name = argument
                .strip_prefix('"')
                .and_then(|quoted| quoted.split_once('"'))
                .map_or_else(
                    || {
                        format!(
                            "<not a string literal: {}>",
                            &argument[..argument.len().min(40)]
                        )
                    },
                    |(name, _)| name.to_owned(),
                );
            found.push(name);
        }
        found
    }

    #[test]
    fn every_site_in_the_source_is_listed_and_every_listed_point_has_a_site() {
        let root = workspace_root();
        let mut files = Vec::new();
        for dir in ["shared", "services", "tests"] {
            rust_files(
                &root.join(dir),
                Path::new(env!("CARGO_MANIFEST_DIR")),
                &mut files,
            );
        }
        assert!(files.len() > 20, "the source tree was found: {files:?}");
        let listed: BTreeSet<&str> = POINTS.iter().copied().collect();
        let mut used = BTreeSet::new();
        let mut unlisted = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).expect("a readable source file");
            for name in sites(&text) {
                if !listed.contains(name.as_str()) {
                    unlisted.push(format!("{}: {name}", file.display()));
                }
                used.insert(name);
            }
        }
        assert!(unlisted.is_empty(), "sites not in POINTS: {unlisted:#?}");
        let unused: Vec<&&str> = listed
            .iter()
            .filter(|name| !used.contains(**name))
            .collect();
        assert!(unused.is_empty(), "POINTS without a site: {unused:?}");
    }

    #[test]
    fn points_are_unique_and_named_service_step_pre_or_post() {
        let unique: BTreeSet<&str> = POINTS.iter().copied().collect();
        assert_eq!(unique.len(), POINTS.len(), "a name is listed twice");
        for name in POINTS {
            let parts: Vec<&str> = name.split('.').collect();
            assert_eq!(parts.len(), 3, "{name}");
            assert!(matches!(parts[2], "pre" | "post"), "{name}");
            for part in &parts[..2] {
                assert!(
                    !part.is_empty()
                        && part
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()),
                    "{name}"
                );
            }
            let pair = if parts[2] == "pre" {
                name.replace(".pre", ".post")
            } else {
                name.replace(".post", ".pre")
            };
            assert!(unique.contains(pair.as_str()), "{name} has no {pair}");
        }
    }

    #[test]
    fn the_failure_modes_document_lists_every_point() {
        let doc = std::fs::read_to_string(workspace_root().join("docs/failure-modes.md"))
            .expect("docs/failure-modes.md");
        let section = doc
            .split_once("## Failpoints")
            .map(|(_, section)| section)
            .expect("a Failpoints section");
        let missing: Vec<&&str> = POINTS
            .iter()
            .filter(|name| !section.contains(&format!("`{name}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "not in the Failpoints table: {missing:?}"
        );
        // And nothing listed there that is not a site (a renamed one left behind).
        let mut stale = Vec::new();
        for row in section.lines().filter(|line| line.starts_with("| `")) {
            let name = row
                .trim_start_matches("| `")
                .split('`')
                .next()
                .unwrap_or_default();
            if !listed(name) {
                stale.push(name.to_owned());
            }
        }
        assert!(stale.is_empty(), "rows naming no site: {stale:?}");
    }

    #[test]
    fn the_site_scanner_finds_literals_and_flags_anything_else() {
        let text = r#"
            sluice_faults::point!("ledger.reserve.pre");
            fail::fail_point!("not.ours");
            point!( "bus.ack.post" );
            sluice_faults::point!(NAME);
        "#;
        let found = sites(text);
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found[0], "ledger.reserve.pre");
        assert_eq!(found[1], "bus.ack.post");
        assert!(found[2].starts_with("<not a string literal"), "{found:?}");
    }

    #[test]
    fn listed_is_exact() {
        assert!(listed("ledger.finalize.post"));
        assert!(!listed("ledger.finalize"));
        assert!(!listed("ledger.finalize.post "));
        assert!(!listed("Ledger.finalize.post"));
    }

    #[test]
    fn failpoints_parse_and_refuse_unknown_sites() {
        let points =
            parse_failpoints("ledger.transition.post=3%return; ledger.finalize.pre=sleep(200);")
                .expect("valid");
        assert_eq!(
            points,
            vec![
                ("ledger.transition.post".to_owned(), "3%return".to_owned()),
                ("ledger.finalize.pre".to_owned(), "sleep(200)".to_owned()),
            ]
        );
        let err = parse_failpoints("ledger.finalise.pre=return").expect_err("a typo");
        assert_eq!(
            err,
            FaultsError::UnknownPoint {
                name: "ledger.finalise.pre".into()
            }
        );
        assert!(err.to_string().contains("ledger.finalise.pre"), "{err}");
        assert!(matches!(
            parse_failpoints("ledger.reserve.pre"),
            Err(FaultsError::Malformed { .. })
        ));
        assert!(matches!(
            parse_failpoints("ledger.reserve.pre="),
            Err(FaultsError::Malformed { .. })
        ));
        assert_eq!(parse_failpoints(" ; ").expect("empty"), vec![]);
    }

    #[test]
    fn clock_skew_parses_per_service_offsets() {
        let skew = ClockSkew::parse("dispatcher=250, reconciler=-300,compensator=100,producer=0")
            .expect("valid");
        assert_eq!(skew.offset_ms("dispatcher"), 250);
        assert_eq!(skew.offset_ms("reconciler"), -300);
        assert_eq!(skew.offset_ms("compensator"), 100);
        assert_eq!(skew.offset_ms("producer"), 0);
        assert!(!skew.is_empty());
        assert_eq!(
            skew.to_string(),
            "dispatcher=250,reconciler=-300,compensator=100,producer=0"
        );
        assert!(ClockSkew::parse("producer=0").expect("valid").is_empty());
        assert!(matches!(
            ClockSkew::parse("sweeper=5"),
            Err(FaultsError::UnknownService { .. })
        ));
        assert!(matches!(
            ClockSkew::parse("dispatcher=soon"),
            Err(FaultsError::BadSkew { .. })
        ));
        assert!(matches!(
            ClockSkew::parse("dispatcher=1,dispatcher=2"),
            Err(FaultsError::BadSkew { .. })
        ));
    }

    #[test]
    fn a_skewed_clock_moves_with_its_source_by_its_offset() {
        let manual = Arc::new(ManualClock::starting_at(Timestamp::from_millis(10_000)));
        let skew = ClockSkew::parse("dispatcher=250,reconciler=-300").expect("valid");
        let source: Arc<dyn Clock> = manual.clone();
        let dispatcher = skew.clock_of("dispatcher", Arc::clone(&source));
        let reconciler = skew.clock_of("reconciler", Arc::clone(&source));
        let producer = skew.clock_of("producer", Arc::clone(&source));
        assert_eq!(dispatcher.now().as_millis(), 10_250);
        assert_eq!(reconciler.now().as_millis(), 9_700);
        assert_eq!(producer.now().as_millis(), 10_000);
        assert!(Arc::ptr_eq(&producer, &source), "no offset, no wrapper");
        manual.advance(std::time::Duration::from_millis(50));
        assert_eq!(dispatcher.now().as_millis(), 10_300);
        assert_eq!(reconciler.now().as_millis(), 9_750);
    }
}
