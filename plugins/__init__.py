"""plugbroker's built-in plugins, one module each, on the same hooks third parties use.

They are listed in :data:`plugbroker.pluginhost.BUILTIN_PLUGINS`.
"""
