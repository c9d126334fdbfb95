//! The checks of what reaches Sluice around the pipeline's own path: lookups slower than every
//! timeout, a catalog that tightens policy mid-run, MCP agents re-driving over HTTP, one key
//! per effect at the upstream, and purges while work is owed.

use super::*;

/// A command whose status checks are slower than every timeout (the upstream's slow lookup
/// keys) still ends: its cut-short checks count as inconclusive and add up to STUCK (or to an
/// escalation after a last look), unless a dispatch answer or a person settled it. It never
/// stays UNKNOWN, or owing a look, for ever.
pub(super) fn slow_lookups_end(view: &View<'_>) -> Checked {
    let mut slow: HashMap<(&str, &str), u64> = HashMap::new();
    for lookup in &view.e.record.slow_lookups {
        *slow
            .entry((lookup.endpoint.as_str(), lookup.key.as_str()))
            .or_default() += 1;
    }
    let mut violations = Vec::new();
    let mut checked = 0;
    for a in view.e.accepted {
        let key = match a.tool.status_check() {
            Some(LookupBy::BusinessKey) => a.business_key.as_deref(),
            Some(LookupBy::IdempotencyKey) => Some(a.idempotency_key.as_str()),
            None => None,
        };
        let Some(&looks) = key.and_then(|key| slow.get(&(a.tool.endpoint(), key))) else {
            continue;
        };
        checked += 1;
        // Missing: NothingLost reports it.
        let Some(command) = view.command(a) else {
            continue;
        };
        if !crate::chaos::at_rest(command) {
            violations.push(view.violation(
                SLOW_LOOKUPS_END,
                a,
                format!(
                    "still {} (verify_pending={}, {} check(s) recorded) after {looks} status check(s) slower than every timeout: cut-short checks never added up",
                    command.status(),
                    command.state.verify_pending,
                    command.state.checks
                ),
            ));
        }
    }
    result(SLOW_LOOKUPS_END, checked, violations)
}

/// Every effect the runner planned reached the upstream under one idempotency key at most:
/// each planned effect has a `ref` of its own, so the same `ref` under a second key is one
/// effect made twice by Sluice (a re-drive or a retry given a new position).
pub(super) fn one_key_per_effect(view: &View<'_>) -> Checked {
    let mut keys: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for request in &view.e.record.dispatches {
        if let (Some(effect), Some(key)) = (
            request.meta.effect_ref.as_deref(),
            request.meta.idempotency_key.as_deref(),
        ) {
            keys.entry(effect).or_default().insert(key);
        }
    }
    let mut violations = Vec::new();
    for (effect, under) in &keys {
        if under.len() < 2 {
            continue;
        }
        let what = format!(
            "effect {effect} reached the upstream under {} idempotency keys: {under:?}",
            under.len()
        );
        let owner = under.iter().find_map(|k| view.by_key.get(k));
        violations.push(match owner {
            Some(a) => {
                let mut violation = view.violation(ONE_KEY_PER_EFFECT, a, what);
                for other in under.iter().filter_map(|k| view.by_key.get(k)).skip(1) {
                    violation
                        .story
                        .push(format!("-- and {} {}:", other.run_id, other.command_key));
                    violation.story.extend(view.story(other));
                }
                violation
            }
            None => Violation {
                invariant: ONE_KEY_PER_EFFECT,
                run_id: "?".into(),
                command_key: "?".into(),
                idempotency_key: under
                    .iter()
                    .next()
                    .map(|k| (*k).to_owned())
                    .unwrap_or_default(),
                what,
                story: Vec::new(),
            },
        });
    }
    result(ONE_KEY_PER_EFFECT, keys.len() as u64, violations)
}

/// The commands of the tools whose policy was tightened at a restart that were admitted under
/// the old policy and had not ended when the new one took over end truthfully: CONFIRMED with
/// the one commit that stands, or FAILED, CANCELLED or COMPENSATED with none standing (for an
/// honest IDEMPOTENT tool: none ever made), unless a person was told (STUCK, escalated).
pub(super) fn tightened_truthfully(view: &View<'_>, tightened: Tightened) -> Checked {
    let mut violations = Vec::new();
    let mut checked = 0;
    for a in view.e.accepted.iter().filter(|a| Policy::tightens(a.tool)) {
        let trail = view.trail(a);
        let admitted_before = trail
            .first()
            .is_some_and(|e| e.record.at.as_millis() < tightened.at_ms);
        let ended_before = trail.iter().any(|e| {
            e.record.at.as_millis() < tightened.at_ms
                && e.record.to.is_some_and(|s| s.is_terminal())
        });
        if !admitted_before || ended_before {
            continue;
        }
        let Some(command) = view.command(a) else {
            continue;
        };
        checked += 1;
        let status = command.status();
        if status == CommandStatus::Stuck || command.state.escalated {
            continue;
        }
        let (commits, live) = (view.commits(a).len(), view.live(a).len());
        let honest = a.tool.honest_idempotent();
        let truthful = match status {
            CommandStatus::Confirmed | CommandStatus::NoCompensation => {
                live == 1 && (!honest || commits == 1)
            }
            CommandStatus::Failed | CommandStatus::Cancelled => {
                live == 0 && (!honest || commits == 0)
            }
            CommandStatus::Compensated => live == 0,
            _ => false,
        };
        if !truthful {
            violations.push(view.violation(
                TIGHTENED_TRUTHFULLY,
                a,
                format!(
                    "admitted under the earlier policy and in flight when the stricter one took over (generation {}), it ended {status} with {live} live of {commits} commit(s) at the upstream, and nobody was told",
                    tightened.generation
                ),
            ));
        }
    }
    result(TIGHTENED_TRUTHFULLY, checked, violations)
}

/// A call made through `sluice mcp` took the position its order gives it, in its first session
/// after a timeout or an unanswered try as well as in a new session that re-drove the run, and
/// the re-drive answered the stored result; the run holds no command that no call planned.
pub(super) fn mcp_same_keys(view: &View<'_>, calls: &[McpCall]) -> Checked {
    let mut violations = Vec::new();
    let mut planned: HashMap<&str, HashSet<&str>> = HashMap::new();
    for call in calls {
        planned
            .entry(call.run_id.as_str())
            .or_default()
            .insert(call.planned_key.as_str());
    }
    let accepted: HashMap<(&str, &str), &Accepted> = view
        .e
        .accepted
        .iter()
        .map(|a| ((a.run_id.as_str(), a.command_key.as_str()), a))
        .collect();
    let violation = |call: &McpCall, key: &str, what: String| match accepted
        .get(&(call.run_id.as_str(), key))
    {
        Some(a) => view.violation(MCP_SAME_KEYS, a, what),
        None => Violation {
            invariant: MCP_SAME_KEYS,
            run_id: call.run_id.clone(),
            command_key: key.to_owned(),
            idempotency_key: format!("{}/{key}", call.run_id),
            what,
            story: Vec::new(),
        },
    };
    for call in calls {
        let how = match (call.timed_out, call.unanswered) {
            (true, _) => " (after the client's timeout and a cancel)",
            (false, 0) => "",
            (false, _) => " (after unanswered tries)",
        };
        if let Some(key) = call.first_key.as_deref()
            && key != call.planned_key
        {
            violations.push(violation(
                call,
                key,
                format!(
                    "the first session's call{how} took {key}, not its position {}",
                    call.planned_key
                ),
            ));
        }
        if let Some(key) = call.redrive_key.as_deref()
            && key != call.planned_key
        {
            violations.push(violation(
                call,
                key,
                format!(
                    "re-driven in a new session, the call took {key}, not its position {}",
                    call.planned_key
                ),
            ));
        }
        if let (Some(first), Some(again)) = (&call.first, &call.redrive)
            && first["status"] == "CONFIRMED"
            && again["status"] == "CONFIRMED"
            && first["external_ref"] != again["external_ref"]
        {
            violations.push(violation(
                call,
                &call.planned_key,
                format!(
                    "the re-drive answered external_ref {}, the first session {}: not the stored result",
                    again["external_ref"], first["external_ref"]
                ),
            ));
        }
    }
    for (run, keys) in &planned {
        for key in view.e.journals.get(*run).into_iter().flatten() {
            if !keys.contains(key.as_str()) {
                let what = format!("the run holds {key}, which no call of its conversation has");
                violations.push(match accepted.get(&(*run, key.as_str())) {
                    Some(a) => view.violation(MCP_SAME_KEYS, a, what),
                    None => Violation {
                        invariant: MCP_SAME_KEYS,
                        run_id: (*run).to_owned(),
                        command_key: key.clone(),
                        idempotency_key: format!("{run}/{key}"),
                        what,
                        story: Vec::new(),
                    },
                });
            }
        }
    }
    result(MCP_SAME_KEYS, calls.len() as u64, violations)
}

/// A run retention purged had every command terminal and owing nothing (no last look, no
/// duplicate's clean-up, nothing due), as the runner read it just before; and it was purged as
/// read: the purge's checkpoint ends the chain the runner read (so the upstream's record is
/// judged against the run's last state by every other check).
pub(super) fn purged_at_rest(purged: &[Purged]) -> Checked {
    let mut violations = Vec::new();
    let mut problem = |run: &str, key: &str, what: String| {
        violations.push(Violation {
            invariant: PURGED_AT_REST,
            run_id: run.to_owned(),
            command_key: key.to_owned(),
            idempotency_key: if key == "-" {
                "-".to_owned()
            } else {
                format!("{run}/{key}")
            },
            what,
            story: Vec::new(),
        });
    };
    for run in purged {
        let Some(snapshot) = &run.snapshot else {
            problem(
                &run.run_id,
                "-",
                format!(
                    "purged at cutoff {} although the runner had not read it as finished and unchanged since",
                    run.cutoff_ms
                ),
            );
            continue;
        };
        if let Some(checkpoint) = &run.checkpoint {
            let (count, last) = (snapshot.audit.len() as u64, snapshot.audit.last());
            let first = snapshot.audit.first().map_or(0, |e| e.record.seq);
            if checkpoint.count != first + count
                || last.is_some_and(|e| e.hash != checkpoint.last_hash)
            {
                problem(
                    &run.run_id,
                    "-",
                    format!(
                        "the purge's checkpoint ({} records, last hash {}) is not the chain read before it ({} records from seq {first}): the run changed after the cutoff and was purged",
                        checkpoint.count, checkpoint.last_hash, count
                    ),
                );
            }
        }
        for command in &snapshot.commands {
            let owed = sluice_core::retention::Owed::of(&command.state);
            if !command.status().is_terminal() || owed.is_some() {
                problem(
                    &run.run_id,
                    &command.command_key.to_string(),
                    format!(
                        "purged while {}{}",
                        command.status(),
                        owed.map_or(String::new(), |o| format!(" and owing {o}"))
                    ),
                );
            }
        }
    }
    result(PURGED_AT_REST, purged.len() as u64, violations)
}
