"""The envs of a round: their state as tables, their creation, the env step
(:class:`~esper.training.envs.host_envs.HostEnvs`), actions, rewards, counterfactuals
and the governor."""
