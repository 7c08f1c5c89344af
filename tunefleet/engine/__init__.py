"""The tuning engine: options, one shard's run, and the workers that lease shard after shard.

* :mod:`~tunefleet.engine.options` — :class:`TuneOptions`, every knob of a run, validated once;
* :mod:`~tunefleet.engine.shard` — :class:`ShardRun`, one shard wired like MetaSchedule's
  ``tune_tasks``: resolve the extension points and policies, search, finish;
* :mod:`~tunefleet.engine.policies` — the rules a shard follows (transfer seeding, warm start,
  filtering, plateau preemption, energy accounting), each a small object called at named points;
* :mod:`~tunefleet.engine.learned` — the class's trained cost model inside MetaSchedule;
* :mod:`~tunefleet.engine.heartbeat` and :mod:`~tunefleet.engine.worker` — leases kept alive,
  and the :class:`Tuner`, ``drain`` and local worker processes.
"""
