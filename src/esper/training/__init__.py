"""Training, in four rooms: the loop (``loop``), the envs and their step (``envs``), the
host passes (``passes``) and the learner (``learning``); ``run.train`` is the entry
point. No eager imports: import the submodule you need
(``esper.training.learning.ppo``) so importing the package stays cheap."""
