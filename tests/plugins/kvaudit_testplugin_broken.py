"""A plugin module that fails while it is imported."""

raise RuntimeError("this plugin needs a device library that is not installed")
