"""The server side: ``banditspec serve`` (tritonserver under a supervisor, the OpenAI-compatible
API) and the rendering of model repositories. The client side is :mod:`banditspec_client`."""
