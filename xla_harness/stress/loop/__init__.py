"""The loop and its commit protocols: the block protocol (blocks, its block size), the per-step
protocols (steps), the pipeline both run on, the block protocol's rollback (rollback, restore,
snapshot) and the ``--resume`` checkpoint."""
