//! The workload: agent runs of several effects, planned in full from the seed before anything
//! runs, so a seed names the same runs, tools, arguments and operator choices every time.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};

use super::catalog::{APPROVE_ABOVE, ToolKind};

/// What the plan is made of.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// Effects in all (the last run may go a little over).
    pub effects: usize,
    /// Share of runs rolled back by an operator while their effects are in flight.
    pub rollback_rate: f64,
    /// Share of runs submitted as one batch.
    pub batch_rate: f64,
    /// Share of effects scheduled (`delay_ms`); half of those are cancelled before they run.
    pub delayed_rate: f64,
    /// Share of wires above the approval threshold.
    pub large_wire_rate: f64,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self {
            effects: 10_000,
            rollback_rate: 0.12,
            batch_rate: 0.2,
            delayed_rate: 0.05,
            large_wire_rate: 0.08,
        }
    }
}

/// One planned effect.
#[derive(Debug, Clone)]
pub struct EffectPlan {
    pub decision: u32,
    pub call_idx: u32,
    pub tool: ToolKind,
    pub args: Value,
    pub delay_ms: Option<u64>,
    /// Cancel the scheduled effect this long after submitting it.
    pub cancel_after_ms: Option<u64>,
}

impl EffectPlan {
    /// The command key Sluice gives it.
    pub fn command_key(&self) -> String {
        format!("d-{}/{}/{}", self.decision, self.tool.name(), self.call_idx)
    }

    /// The business key Sluice renders from its arguments (the catalog's `{ref}:{amount_minor}`),
    /// for the tools that declare one.
    pub fn business_key(&self) -> Option<String> {
        self.tool.has_business_key().then(|| {
            format!(
                "{}:{}",
                self.args["ref"].as_str().unwrap_or_default(),
                self.args["amount_minor"]
            )
        })
    }

    /// The submission body.
    pub fn submission(&self, run_id: &str) -> Value {
        let mut body = json!({
            "run_id": run_id,
            "decision": self.decision,
            "tool": self.tool.name(),
            "call_idx": self.call_idx,
            "args": self.args,
        });
        if let Some(delay) = self.delay_ms {
            body["delay_ms"] = json!(delay);
        }
        body
    }
}

/// One planned run.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub run_id: String,
    pub effects: Vec<EffectPlan>,
    /// Submitted as one `POST /v1/effects/batch`.
    pub batch: bool,
    /// Rolled back this long after its last submission.
    pub rollback_after_ms: Option<u64>,
}

/// The whole workload of `seed`.
pub fn plan(seed: u64, options: &WorkloadOptions) -> Vec<RunPlan> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x05ee_d0fc_4a05);
    let total_weight: u32 = ToolKind::ALL.iter().map(|k| k.weight()).sum();
    let mut runs = Vec::new();
    let mut planned = 0;
    while planned < options.effects {
        let run_id = format!("chaos-{seed:x}-{}", runs.len());
        let size = rng.random_range(2..=8usize);
        let mut effects = Vec::with_capacity(size);
        let mut decision = 1u32;
        for i in 0..size {
            let tool = pick_tool(&mut rng, total_weight);
            // Now and then several calls in one decision: each call of a tool its own index.
            let call_idx = effects
                .iter()
                .filter(|e: &&EffectPlan| e.decision == decision && e.tool == tool)
                .count();
            let call_idx = u32::try_from(call_idx).unwrap_or(u32::MAX);
            let amount = if tool == ToolKind::Wire && rng.random_bool(options.large_wire_rate) {
                rng.random_range(APPROVE_ABOVE + 1..APPROVE_ABOVE * 3)
            } else {
                rng.random_range(100..500_000)
            };
            let delayed = tool != ToolKind::Search && rng.random_bool(options.delayed_rate);
            let delay_ms = delayed.then(|| rng.random_range(300..1_500u64));
            let cancel_after_ms = match delay_ms {
                Some(delay) if rng.random_bool(0.5) => Some(rng.random_range(0..delay + 200)),
                _ => None,
            };
            effects.push(EffectPlan {
                decision,
                call_idx,
                tool,
                args: json!({
                    "ref": format!("{run_id}-{i}"),
                    "amount_minor": amount,
                    "note": "chaos",
                }),
                delay_ms,
                cancel_after_ms,
            });
            if !rng.random_bool(0.15) {
                decision += 1;
            }
        }
        planned += effects.len();
        runs.push(RunPlan {
            run_id,
            effects,
            batch: rng.random_bool(options.batch_rate),
            rollback_after_ms: rng
                .random_bool(options.rollback_rate)
                .then(|| rng.random_range(0..1_500u64)),
        });
    }
    runs
}

fn pick_tool(rng: &mut StdRng, total_weight: u32) -> ToolKind {
    let mut draw = rng.random_range(0..total_weight);
    for kind in ToolKind::ALL {
        if draw < kind.weight() {
            return kind;
        }
        draw -= kind.weight();
    }
    ToolKind::Search
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_seed_plans_the_same_workload_and_keys_are_unique() {
        let options = WorkloadOptions {
            effects: 2_000,
            ..WorkloadOptions::default()
        };
        let a = plan(11, &options);
        let b = plan(11, &options);
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| {
            x.run_id == y.run_id
                && x.effects.len() == y.effects.len()
                && x.effects
                    .iter()
                    .zip(&y.effects)
                    .all(|(e, f)| e.args == f.args)
        }));
        let effects: usize = a.iter().map(|r| r.effects.len()).sum();
        assert!((2_000..2_008).contains(&effects));
        let mut keys = HashSet::new();
        for run in &a {
            for effect in &run.effects {
                assert!(keys.insert((run.run_id.clone(), effect.command_key())));
            }
        }
        for kind in ToolKind::ALL {
            assert!(
                a.iter().flat_map(|r| &r.effects).any(|e| e.tool == kind),
                "{} is used",
                kind.name()
            );
        }
        assert!(a.iter().any(|r| r.rollback_after_ms.is_some()));
        assert!(a.iter().any(|r| r.batch));
        assert!(
            a.iter()
                .flat_map(|r| &r.effects)
                .any(|e| e.cancel_after_ms.is_some())
        );
        assert_ne!(plan(12, &options)[0].effects[0].args, a[0].effects[0].args);
    }
}
