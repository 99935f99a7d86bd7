"""Package data: shipped arch profiles (arch_<family>.json), read with importlib.resources."""
