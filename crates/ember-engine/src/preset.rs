//! Algorithm presets: an advantage estimator, a policy loss, an aggregation and filters, as the
//! papers define them (each variant cites its paper). A recipe names a preset and may override
//! its estimator or loss; the values live here, beside the estimators and losses they choose.

use crate::{
    ActorLossConfig, AdvantageConfig, AdvantageKind, BatchBaseline, CriticConfig, LossAgg,
    MismatchCorrection, Pact, PolicyLossKind, RatioLevel, ReinforceAda, RejectGroups, ReplayConfig,
    StdKind, TurnUpdates,
};
use serde::{Deserialize, Serialize};

/// What a preset resolves to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PresetParts {
    /// The advantage estimator.
    pub advantage: AdvantageConfig,
    /// The actor objective.
    pub loss: ActorLossConfig,
    /// DAPO's dynamic sampling: drop groups whose rewards are all equal.
    pub dynamic_sampling: bool,
    /// SeeUPO's turn-by-turn sequential update (multi-turn episodes only).
    pub turn_updates: Option<TurnUpdates>,
    /// Reinforce-Ada's adaptive sampling in rounds.
    pub adaptive: Option<ReinforceAda>,
    /// A learned critic (PPO): its values feed GAE, its returns train it.
    pub critic: Option<CriticConfig>,
    /// Replay of hard groups (ReRULE).
    pub replay: Option<ReplayConfig>,
}

/// Algorithm presets: an advantage estimator, a policy loss, an aggregation and filters, as the
/// papers define them. `[advantage]` / `[loss]` tables in a recipe override the preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// GRPO (Shao et al. 2024): group-normalised advantages, PPO clip.
    #[default]
    Grpo,
    /// Dr.GRPO (Liu et al. 2025): no std, constant-normalised token sum.
    DrGrpo,
    /// RLOO (Ahmadian et al. 2024) with PPO clip.
    Rloo,
    /// REINFORCE++ (Hu 2025): the reward-to-go whitened over the batch; the paper's k1 KL in the
    /// reward is `[advantage] kind = "reinforce_plus_plus", kl_coef = β` (0 here, as verl's
    /// `use_kl_in_reward = False`), which keeps the starting policy as the reference.
    #[serde(rename = "reinforce++")]
    ReinforcePp,
    /// REINFORCE++-baseline (Hu 2025): group mean then batch whitening.
    #[serde(rename = "reinforce++-baseline")]
    ReinforcePpBaseline,
    /// DAPO (Yu et al. 2025): clip-higher, token-mean, dynamic sampling, overlong shaping.
    Dapo,
    /// CISPO (MiniMax-M1 2025): clipped stop-gradient IS weight on log π.
    Cispo,
    /// GSPO (Zheng et al. 2025): sequence-level ratio.
    Gspo,
    /// TOPR (Le Roux et al. 2025): tapered IS for negatives.
    Topr,
    /// RAFT (Dong et al. 2023): SFT on positives.
    Raft,
    /// Reinforce-Rej (Xiong et al. 2025): reject all-right/all-wrong groups.
    ReinforceRej,
    /// OPO (Hao et al. 2025): length-weighted baseline.
    Opo,
    /// ReMax (Li et al. 2024): greedy-rollout baseline.
    Remax,
    /// BNPO (Xiao et al. 2025, arXiv 2506.02864; the authors' `recipe/bnpo/run.sh`): the
    /// Beta-normalised advantage, PPO clip 0.2/0.28, seq-mean-token-sum, no KL. `[advantage]
    /// kind = "bnpo", decompose = true` adds the advantage decomposition over the reward's terms.
    Bnpo,
    /// SeeUPO (Hu et al. 2026, arXiv 2602.06554; AgentEvolver `qwen3-seeupo-*.yaml`):
    /// multi-turn episodes updated turn by turn in reverse order, GRPO's group mean without
    /// std then sequence-level batch whitening clamped to ±3, GSPO's sequence ratio,
    /// seq-mean-token-mean.
    Seeupo,
    /// Reinforce-Ada (Xiong et al. 2025, arXiv 2510.04996; RLHFlow/Reinforce-Ada
    /// `run_reinforce_ada.sh`): sampling in rounds until each prompt has a balanced pool, down
    /// to `samples_per_prompt`; GRPO's mean over the whole pool without std; PPO clip 0.2/0.28,
    /// token-mean.
    ReinforceAda,
    /// PPO with a learned critic (Schulman et al. 2017; Ouyang et al. 2022; verl
    /// `adv_estimator=gae` with its `ppo_trainer.yaml` defaults): GAE with γ = λ = 1 and
    /// whitened advantages, PPO clip 0.2, token-mean; the critic's clipped value loss
    /// (ε_v = 0.5), trained on the rollout as sampled.
    Ppo,
    /// PPO + PACT (Policy Aligned Critic Training): as [`Preset::Ppo`], the critic trained after
    /// the actor with importance weights towards the updated policy ([`crate::Pact`]).
    PpoPact,
    /// ReRULE-style replay ([`crate::replay`]): GRPO, PPO clip 0.2, token-mean, with hard
    /// groups of the first half of the run replayed later, importance-weighted by truncated
    /// token-level IS (cap 2) between the stored sampler log-probs and the current policy.
    Rerule,
    /// BASIS (Gong et al. 2026, arXiv 2605.27293; [`crate::basis`]): one rollout per prompt,
    /// the baseline a leave-one-out kernel average over the batch's other prompts, whitened;
    /// PPO clip 0.2, token-mean. Run it with `samples_per_prompt = 1`, the paper's setting;
    /// with more, a prompt's other samples (at distance 0) dominate its baseline, which then
    /// approaches RLOO's.
    Basis,
    /// On-policy distillation (Agarwal et al. 2024, GKD, eq. 4 with the reverse KL; the LLM
    /// recipe of Thinking Machines' "On-Policy Distillation", 2025): the student samples, a
    /// teacher scores each sampled token, and r_t = log π_teacher(y_t) − log π_student(y_t)
    /// (the job's `[teacher]` puts it in `token_rewards`) is each token's advantage as it is:
    /// REINFORCE++'s returns with γ = 0 and no whitening, PPO clip 0.2, token-mean.
    Opd,
}

impl Preset {
    /// Every preset, in table order.
    pub const ALL: [Preset; 21] = [
        Self::Grpo,
        Self::Rloo,
        Self::ReinforcePp,
        Self::ReinforcePpBaseline,
        Self::DrGrpo,
        Self::Dapo,
        Self::Cispo,
        Self::Gspo,
        Self::Topr,
        Self::Raft,
        Self::ReinforceRej,
        Self::Opo,
        Self::Remax,
        Self::Bnpo,
        Self::Seeupo,
        Self::ReinforceAda,
        Self::Ppo,
        Self::PpoPact,
        Self::Rerule,
        Self::Basis,
        Self::Opd,
    ];

    /// The recipe name of the preset (its serde name).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Grpo => "grpo",
            Self::DrGrpo => "dr-grpo",
            Self::Rloo => "rloo",
            Self::ReinforcePp => "reinforce++",
            Self::ReinforcePpBaseline => "reinforce++-baseline",
            Self::Dapo => "dapo",
            Self::Cispo => "cispo",
            Self::Gspo => "gspo",
            Self::Topr => "topr",
            Self::Raft => "raft",
            Self::ReinforceRej => "reinforce-rej",
            Self::Opo => "opo",
            Self::Remax => "remax",
            Self::Bnpo => "bnpo",
            Self::Seeupo => "seeupo",
            Self::ReinforceAda => "reinforce-ada",
            Self::Ppo => "ppo",
            Self::PpoPact => "ppo-pact",
            Self::Rerule => "rerule",
            Self::Basis => "basis",
            Self::Opd => "opd",
        }
    }

    /// Whether the preset needs multi-turn episodes (turn ids): `kind = "agent"` recipes.
    pub fn multi_turn_only(&self) -> bool {
        self.parts(1).turn_updates.is_some()
    }

    /// Whether the preset's reward comes from a teacher model (a recipe's `[teacher]`).
    pub fn needs_teacher(&self) -> bool {
        *self == Self::Opd
    }

    /// Whether the preset trains a critic (PPO's value model).
    pub fn has_critic(&self) -> bool {
        self.parts(1).critic.is_some()
    }

    /// The preset's estimator, actor loss and filters; `max_new_tokens` is Dr.GRPO's
    /// normalising constant.
    pub fn parts(&self, max_new_tokens: usize) -> PresetParts {
        let (kind, loss) = self.estimator_and_loss(max_new_tokens);
        let mut p = PresetParts {
            advantage: AdvantageConfig::new(kind),
            loss,
            dynamic_sampling: *self == Self::Dapo,
            turn_updates: None,
            adaptive: None,
            critic: None,
            replay: None,
        };
        match self {
            Self::Seeupo => {
                p.turn_updates = Some(TurnUpdates::default());
                // SeeUPO's `special_norm`: batch whitening then clamp(−3, 3).
                p.advantage.whiten_rows = true;
                p.advantage.clip = Some(3.0);
            }
            Self::ReinforceAda => p.adaptive = Some(ReinforceAda::default()),
            Self::Rerule => {
                p.replay = Some(ReplayConfig::default());
                p.loss.mismatch = Some(MismatchCorrection::default());
            }
            Self::Ppo | Self::PpoPact => {
                p.critic = Some(CriticConfig {
                    pact: (*self == Self::PpoPact).then(Pact::default),
                    ..CriticConfig::default()
                });
            }
            _ => {}
        }
        p
    }

    /// The preset's estimator and actor loss (the settings each paper or reference uses).
    fn estimator_and_loss(&self, max_new_tokens: usize) -> (AdvantageKind, ActorLossConfig) {
        const GRPO: AdvantageKind = AdvantageKind::Grpo {
            std: StdKind::Unbiased,
            epsilon: 1e-6,
            scale_by_std: true,
        };
        const PPO: PolicyLossKind = PolicyLossKind::Ppo {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
        };
        // DAPO's clip-higher.
        const CLIP_HIGHER: PolicyLossKind = PolicyLossKind::Ppo {
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: None,
        };
        const GSPO: PolicyLossKind = PolicyLossKind::Gspo {
            clip_low: 3e-4,
            clip_high: 4e-4,
        };
        let actor = |policy, agg| ActorLossConfig {
            policy,
            agg,
            ..ActorLossConfig::default()
        };
        let token_mean = |policy| actor(policy, LossAgg::TokenMean);
        match self {
            Self::Grpo | Self::Rerule => (GRPO, token_mean(PPO)),
            Self::DrGrpo => {
                let constant = max_new_tokens as f32;
                let agg = LossAgg::SeqMeanTokenSumNorm { constant };
                (AdvantageKind::DrGrpo, actor(PPO, agg))
            }
            Self::Rloo => (AdvantageKind::Rloo, token_mean(PPO)),
            Self::ReinforcePp => {
                let kind = AdvantageKind::ReinforcePlusPlus {
                    gamma: 1.0,
                    kl_coef: 0.0,
                    whiten: true,
                };
                (kind, token_mean(PPO))
            }
            Self::Opd => {
                let kind = AdvantageKind::ReinforcePlusPlus {
                    gamma: 0.0,
                    kl_coef: 0.0,
                    whiten: false,
                };
                (kind, token_mean(PPO))
            }
            Self::ReinforcePpBaseline => {
                (AdvantageKind::ReinforcePlusPlusBaseline, token_mean(PPO))
            }
            Self::Dapo => (GRPO, token_mean(CLIP_HIGHER)),
            Self::Cispo => {
                let cispo = PolicyLossKind::Cispo {
                    clip_low: 1.0,
                    clip_high: 0.28,
                };
                (GRPO, token_mean(cispo))
            }
            Self::Gspo => (GRPO, actor(GSPO, LossAgg::SeqMeanTokenMean)),
            Self::Topr => {
                let baseline = BatchBaseline::Mean;
                let level = RatioLevel::Sequence;
                let topr = PolicyLossKind::Topr { level };
                (AdvantageKind::Reinforce { baseline }, token_mean(topr))
            }
            Self::Raft => {
                let kind = AdvantageKind::Raft { threshold: 0.5 };
                (kind, token_mean(PolicyLossKind::Vanilla))
            }
            Self::ReinforceRej => {
                let kind = AdvantageKind::ReinforceRej {
                    reject: RejectGroups::Both,
                    threshold: 0.5,
                };
                (kind, token_mean(PPO))
            }
            Self::Opo => (AdvantageKind::Opo, token_mean(PPO)),
            Self::Remax => (AdvantageKind::Remax, token_mean(PPO)),
            Self::Bnpo => {
                let kind = AdvantageKind::Bnpo { decompose: false };
                (kind, actor(CLIP_HIGHER, LossAgg::SeqMeanTokenSum))
            }
            Self::Seeupo => (
                AdvantageKind::DrGrpo,
                actor(GSPO, LossAgg::SeqMeanTokenMean),
            ),
            Self::ReinforceAda => {
                let kind = AdvantageKind::Grpo {
                    std: StdKind::Unbiased,
                    epsilon: 1e-6,
                    scale_by_std: false,
                };
                (kind, token_mean(CLIP_HIGHER))
            }
            Self::Basis => {
                let kind = AdvantageKind::Basis {
                    bandwidth: 0.5,
                    prior: 1.0,
                    whiten: true,
                };
                (kind, token_mean(PPO))
            }
            Self::Ppo | Self::PpoPact => {
                let kind = AdvantageKind::Gae {
                    gamma: 1.0,
                    lambda: 1.0,
                    whiten: true,
                };
                (kind, token_mean(PPO))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every preset's name is its serde name, so a recipe's `algorithm = "<name>"` round-trips.
    #[test]
    fn names_are_serde_names() {
        for p in Preset::ALL {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
            let back: Preset = serde_json::from_str(&json).unwrap();
            assert_eq!(back, p);
        }
    }

    /// DAPO's clip-higher (Yu et al. 2025, eq. 8: ε_low 0.2, ε_high 0.28) with dynamic sampling;
    /// GRPO's symmetric 0.2 without.
    #[test]
    fn dapo_clips_higher_and_filters() {
        let d = Preset::Dapo.parts(64);
        assert!(d.dynamic_sampling);
        assert_eq!(
            d.loss.policy,
            PolicyLossKind::Ppo {
                clip_low: 0.2,
                clip_high: 0.28,
                dual_clip: None
            }
        );
        let g = Preset::Grpo.parts(64);
        assert!(!g.dynamic_sampling);
        assert_eq!(
            g.loss.policy,
            PolicyLossKind::Ppo {
                clip_low: 0.2,
                clip_high: 0.2,
                dual_clip: None
            }
        );
        assert_eq!(
            Preset::DrGrpo.parts(64).loss.agg,
            LossAgg::SeqMeanTokenSumNorm { constant: 64.0 }
        );
    }

    /// PPO: GAE (γ = λ = 1, whitened) with a critic (ε_v = 0.5); PACT adds the critic's
    /// importance weights; ReRULE adds replay with truncated IS; BASIS needs no groups.
    #[test]
    fn critic_replay_and_basis_presets() {
        let p = Preset::Ppo.parts(8);
        assert!(
            p.critic
                .is_some_and(|c| c.pact.is_none() && c.value_clip == 0.5)
        );
        assert_eq!(
            p.advantage.kind,
            AdvantageKind::Gae {
                gamma: 1.0,
                lambda: 1.0,
                whiten: true
            }
        );
        assert_eq!(
            Preset::PpoPact.parts(8).critic.and_then(|c| c.pact),
            Some(Pact::default())
        );
        let r = Preset::Rerule.parts(8);
        assert_eq!(r.replay, Some(ReplayConfig::default()));
        assert_eq!(r.loss.mismatch, Some(MismatchCorrection::default()));
        let b = Preset::Basis.parts(8).advantage.kind;
        assert!(b.group_free() && b.needs_features());
        assert!(Preset::Ppo.has_critic() && !Preset::Grpo.has_critic());
    }
}
