"""Target engines behind the verify contract (see :mod:`banditspec.engine.contract`).

Besides the engines (:mod:`.reference`, :mod:`.trtllm`) and the BLS adapter
(:mod:`.tensor_codec`): the ``target`` model's helpers, :mod:`.prefill_split` (a batch's
prefills split from its continuations) and :mod:`.target_metrics` (verify-batch metrics),
and :mod:`.uniform_inputs` (the BLS shim that lets plain-decoding steps batch with
drafting ones)."""
