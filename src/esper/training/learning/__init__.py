"""The learner: the policy built from the config, the rollout buffer, the normalisers
and the PPO update."""
