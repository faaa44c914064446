"""Offline evaluation: exact replay of policies from recorded traces and the paper's simulated arms."""
