"""The ``banditspec`` Triton model's logic without Triton: its configuration, how it is assembled,
admission, TensorRT-LLM request compatibility and the controller that serves requests."""
