"""The policy side: action space and masks, observation features, learned and heuristic
policies. Submodules import torch; import them directly (``esper.policy.network``)."""
