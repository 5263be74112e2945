"""The host passes (train, then validation with the counterfactual rows): per env
(``batch_ops``) or batched (``host_batching``, over ``slot_groups`` and ``host_store``),
behind the same arguments and results."""
