"""The learning side: rollout buffer, PPO, normalisers, rewards, counterfactual
attribution, the governor and the vectorized trainer. No eager imports: import the
submodule you need (``esper.training.ppo``) so importing the package stays cheap."""
