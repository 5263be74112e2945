"""The training loop: the vectorized trainer, its setup, checkpoints, the recorder
(results into events), evaluation, ranks, faults and anomalies."""
