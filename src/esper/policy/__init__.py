"""The policy side: action space and masks, observation features, the learned policy
(``network``) and the baselines that share its interface (``protocol.Policy``):
``heuristic``, ``eager``, ``random_valid`` and ``static``. Submodules import torch;
import them directly (``esper.policy.network``)."""
