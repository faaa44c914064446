"""The EAGLE-1 draft head of the ``eagle`` drafter: model, training text, features, training.

* :mod:`.head`      EagleConfig, EagleHead (one decoder layer), save_head / load_head
* :mod:`.corpus`    training text (ShareGPT train split + Python stdlib; no benchmark prompts)
* :mod:`.features`  target features computed once into the cache folder
* :mod:`.objective` the loss, unrolled over draft steps
* :mod:`.train`     ``banditspec build eagle`` (add_arguments / run)
* :mod:`.evaluate`  acceptance and step-cost measurements

The drafter itself is :mod:`banditspec.drafters.eagle`.
"""
