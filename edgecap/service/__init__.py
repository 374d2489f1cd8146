"""`edgecap serve`: the long-running service (config, sinks, systemd notify, HTTP, orchestration).

Submodules import their optional dependencies (paho-mqtt, prometheus-client)
themselves, so importing this package costs nothing.
"""
