"""The configuration schema (``plugbroker.xsd``) and the default configuration (``default.xml``).

Not code: this directory is installed as the package ``plugbroker.config_data`` (see pyproject.toml's
``package-dir``) so that :func:`plugbroker.config.schema.config_file` finds the files through
:mod:`importlib.resources` when the broker is installed from a wheel.
"""
