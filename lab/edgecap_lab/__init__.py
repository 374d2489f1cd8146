"""edgecap's lab: what measures the product, installed beside the runtime, never on a board.

``bench`` (``edgecap bench``: schedules on emulated boards and on this host),
``truth_bench`` (``edgecap bench --adapt``: the closed loop against a hidden
truth), ``soak`` (``python tools/soak.py``: a long run with faults),
``evaluate`` (``edgecap eval``: caption quality on a dataset split), ``plots``
(their figures), ``compile_benchmark`` and ``cost_model_validity`` (the
compiler's split and cost model against baselines and published figures),
``keras_zoo`` (the compiler benchmark's models), ``loader_fuzz`` and
``model_fuzz`` (the fuzzers the suite samples and tools/ runs long).

The ``edgecap`` command reaches these modules through one door
(``edgecap.cli._lab``); nothing in ``edgecap`` or ``edgecap_compile`` imports them.
"""
