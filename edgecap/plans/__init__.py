"""What a plan is: which segment of the encoder runs on which device, and what that costs.

* ``plan``: the records (``Plan``, ``Stage``, ``CostParts``) and plan.json, read and written.
* ``pricing``: the one function for a plan's period and latency under a board
  as profiled, as corrected by measurement, or as an emulated truth.
* ``bundled``: the plans a bundle carries (each board's best, and candidates), loaded once.
* ``compiler``: the runtime's one, lazy door to the compiler (plans for a board profile on the fly).
* ``compiled_encoder``: a bundle's EdgeTPU-compiled encoder, or its CPU twin, run whole.
* ``coral_pipeline``: Coral's own compiled segments imported as a plan (``edgecap plan import``).

Which plan runs is decided above this package, by ``edgecap.planner``.
"""
