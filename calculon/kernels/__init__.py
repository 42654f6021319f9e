"""Measured kernel tables: reading NVIDIA AIConfigurator's database
(:mod:`.aic`), reducing it to a system file's ``measured`` section
(:mod:`.import_kernels`) and pricing GEMMs, attention and in-node
collectives from it (:mod:`.tables`)."""
