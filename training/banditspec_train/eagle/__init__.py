"""Offline training of the Eagle draft heads (``banditspec build eagle``, engine_build/eagle/).

* :mod:`.corpus`      fixed training text (ShareGPT train split + Python stdlib; no benchmark prompts)
* :mod:`.selfdistill` the target answers training prompts greedily, keeping its features
* :mod:`.features`    target features computed once into the cache folder
* :mod:`.dataset`     the training set (self-distilled + fixed text), cached
* :mod:`.vocab`       the draft vocabulary
* :mod:`.objective`   the EAGLE-1 loss, unrolled over draft steps; :mod:`.objective3` EAGLE-3's
* :mod:`.train`       ``banditspec build eagle`` (add_arguments / run)
* :mod:`.evaluate`    acceptance and step-cost measurements
* :mod:`.export`      an EAGLE-3 head as an upstream-style checkpoint
* :mod:`.plots`       the loss curve
* :mod:`.allocator`   glibc malloc keeps freed memory; PyTorch's big buffers on huge pages

The heads themselves (what serving runs) are :mod:`banditspec.eagle`.
"""
