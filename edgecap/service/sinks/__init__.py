"""Where captions go: stdout (the journal under systemd), a JSON-lines file, an MQTT broker.

One module per sink (``stdout``, ``jsonl``, ``mqtt``) and what they share
(``base``: the ``Sink`` calls, the records, ``SinkSet``). A sink that cannot
start because of the config (an unwritable file) fails at ``open_sinks``,
before the service starts; a broker that is down is never fatal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, TextIO

from edgecap.errors import ConfigError
from edgecap.service.sinks.base import Sink, SinkSet, caption_record, event_record
from edgecap.service.sinks.jsonl import JsonlSink
from edgecap.service.sinks.mqtt import MqttSink, discovery_configs, discovery_id, tls_context, topic_level
from edgecap.service.sinks.stdout import PRIORITIES, JournalFormatter, StdoutSink, is_journal

if TYPE_CHECKING:
    from edgecap.service.config import ServiceConfig

__all__ = ["PRIORITIES", "JournalFormatter", "JsonlSink", "MqttSink", "Sink", "SinkSet", "StdoutSink",
           "caption_record", "discovery_configs", "discovery_id", "event_record", "is_journal", "open_sinks",
           "tls_context", "topic_level"]


def open_sinks(config: "ServiceConfig", stdout: Optional[TextIO] = None, extra: Sequence[Sink] = ()) -> SinkSet:
    """Opens the sinks the config enables.

    Args:
      config: The service config (its ``sinks`` tables).
      stdout: Stream for the stdout sink (default ``sys.stdout``).
      extra: Sinks the caller opened (the history), put last; closed here if another cannot start.

    Returns:
      The sinks, as one ``SinkSet``.

    Raises:
      ConfigError: If a sink cannot start (an unwritable JSON-lines path, MQTT
        TLS files that do not load); an unreachable broker is not an error.
    """
    sinks: List[Sink] = []
    jsonl = config.sinks.jsonl
    try:
        if jsonl.path:
            sinks.append(JsonlSink(jsonl.path, jsonl.max_bytes, jsonl.backups, jsonl.events))
        if config.sinks.stdout.enabled:
            sinks.append(StdoutSink(stdout))
        if config.sinks.mqtt.host:  # raises, if at all, before its thread starts
            sinks.append(MqttSink(config.sinks.mqtt, cameras=[camera.name for camera in config.cameras]))
    except ConfigError:
        SinkSet(sinks + list(extra)).close()  # the file already opened
        raise
    return SinkSet(sinks + list(extra))
