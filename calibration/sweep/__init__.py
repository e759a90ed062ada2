"""Engine sweeps: time vLLM or SGLang end to end into dataset rows (README.md)."""
