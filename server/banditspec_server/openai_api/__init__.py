"""OpenAI-compatible HTTP API for BanditSpec (FastAPI + uvicorn, talks to Triton through tritonclient gRPC)."""
