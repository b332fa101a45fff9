"""Built-in executors: ``inline``, ``threads`` (default), ``processes`` and ``mock``."""
