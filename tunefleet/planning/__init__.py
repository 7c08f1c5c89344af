"""Planning tuning work: what a request spends (:mod:`~tunefleet.planning.spend`), budgets spent in
rounds, their allocation over workloads, the shard queue and its leases, plateau preemption, and
where a search starts (transfer, warm shapes)."""
