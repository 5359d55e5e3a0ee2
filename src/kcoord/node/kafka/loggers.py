"""Broker loggers: the BROKER_LOGGER config resource (type 8) of DescribeConfigs and
IncrementalAlterConfigs, Kafka's ``Log4jController`` over this node's Python loggers.

``kafka-configs.sh --entity-type broker-loggers --entity-name <node id>`` describes every
logger with its effective level in Kafka's names (``root`` for the root logger) and sets or
removes a logger's level at run time, for this node only and never persisted: a restart goes
back to the logging setup, as Kafka's broker does. As Kafka's ``ConfigAdminManager``:

- the resource names this node (another id, a name that is not a number or an empty one is
  INVALID_REQUEST);
- SET takes one of Kafka's levels (``LogLevelConfig.VALID_LOG_LEVELS``: FATAL, ERROR, WARN,
  INFO, DEBUG, TRACE; Python has no TRACE: it is level 5, below DEBUG) for a logger that
  exists, else INVALID_CONFIG; DELETE gives the logger its parent's level back, and is
  INVALID_REQUEST for ``root``; APPEND and SUBTRACT are INVALID_REQUEST, and so is the
  legacy AlterConfigs;
- the whole resource is checked before any level changes; ``validate_only`` changes none.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Final

from kcoord.errors import Errors
from kcoord.raft.controller import ConfigOp

BROKER_LOGGER: Final = 8  # ConfigResource.Type.BROKER_LOGGER
DYNAMIC_BROKER_LOGGER_CONFIG: Final = 6  # DescribeConfigsResponse ConfigSource
ROOT_LOGGER: Final = "root"
TRACE: Final = 5
# Kafka's levels, most severe first, and the Python level each is.
LEVELS: Final = {
    "FATAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
}


class LoggerConfigError(Exception):
    """A BROKER_LOGGER resource refused whole, with Kafka's error code and message."""

    def __init__(self, code: Errors, message: str) -> None:
        super().__init__(message)
        self.code = code


def level_name(level: int) -> str:
    """Kafka's name for a Python level: the most severe of Kafka's at or below it."""
    for name, value in LEVELS.items():
        if level >= value:
            return name
    return "TRACE"  # NOTSET and anything below 5 let every record through


def _logger(name: str) -> logging.Logger | None:
    if name == ROOT_LOGGER:
        return logging.getLogger()
    found = logging.Logger.manager.loggerDict.get(name)
    return found if isinstance(found, logging.Logger) else None  # not a PlaceHolder


def loggers() -> dict[str, str]:
    """Every logger of this process with its effective level, ``root`` first
    (``Log4jController.loggers``)."""
    out = {ROOT_LOGGER: level_name(logging.getLogger().level)}
    for name in sorted(logging.Logger.manager.loggerDict):
        logger = _logger(name)
        if logger is not None:
            out[name] = level_name(logger.getEffectiveLevel())
    return out


def check_described_name(name: str, node_id: int) -> None:
    """ConfigHelper's checks of a described BROKER_LOGGER resource's name."""
    if not name:
        raise LoggerConfigError(Errors.INVALID_REQUEST, "Broker id must not be empty")
    if as_int(name) is None:
        raise LoggerConfigError(
            Errors.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}"
        )
    if as_int(name) != node_id:
        raise LoggerConfigError(
            Errors.INVALID_REQUEST, f"Unexpected broker id, expected {node_id} but received {name}"
        )


def check_altered_name(name: str, node_id: int) -> None:
    """``ConfigAdminManager.validateResourceNameIsCurrentNodeId``."""
    if as_int(name) is None:
        raise LoggerConfigError(
            Errors.INVALID_REQUEST, f"Node id must be an integer, but it is: {name}"
        )
    if as_int(name) != node_id:
        raise LoggerConfigError(
            Errors.INVALID_REQUEST, f"Unexpected broker id, expected {node_id}, but received {name}"
        )


def as_int(name: str) -> int | None:
    """Java's ``Integer.parseInt``: an optional sign and ASCII digits, within 32 bits."""
    digits = name[1:] if name[:1] in ("-", "+") else name
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    significant = digits.lstrip("0") or "0"
    if len(significant) > 10:
        return None  # no int; ``int`` itself raises past 4,300 digits
    value = int(significant) * (-1 if name[0] == "-" else 1)
    return value if -(2**31) <= value < 2**31 else None


def check_alter(resource: str, node_id: int, ops: Sequence[tuple[str, int, str | None]]) -> None:
    """``ConfigAdminManager.preprocess`` of a BROKER_LOGGER resource, in its order: keys
    named twice, null values, the node id, then ``validateLogLevelConfigs``; raises for the
    first thing refused."""
    names = [key for key, _, _ in ops]
    if len(set(names)) != len(names):
        raise LoggerConfigError(Errors.INVALID_REQUEST, "Error due to duplicate config keys")
    null = [key for key, op, value in ops if op != ConfigOp.DELETE and value is None]
    if null:
        raise LoggerConfigError(
            Errors.INVALID_REQUEST, "Null value not supported for : " + ", ".join(null)
        )
    check_altered_name(resource, node_id)
    for name, op, value in ops:
        if op in (ConfigOp.APPEND, ConfigOp.SUBTRACT):
            raise LoggerConfigError(
                Errors.INVALID_REQUEST,
                f"{ConfigOp(op).name} operation is not allowed for the BROKER_LOGGER resource",
            )
        if op not in (ConfigOp.SET, ConfigOp.DELETE):
            raise LoggerConfigError(
                Errors.INVALID_REQUEST,
                f"Unknown operation type {op} is not allowed for the BROKER_LOGGER resource",
            )
        if _logger(name) is None:
            raise LoggerConfigError(Errors.INVALID_CONFIG, f"Logger {name} does not exist!")
        if op == ConfigOp.DELETE and name == ROOT_LOGGER:
            raise LoggerConfigError(
                Errors.INVALID_REQUEST,
                f"Removing the log level of the {ROOT_LOGGER} logger is not allowed",
            )
        if op == ConfigOp.SET and value not in LEVELS:
            raise LoggerConfigError(
                Errors.INVALID_CONFIG,
                f"Cannot set the log level of {name} to {value} as it is not a supported log "
                f"level. Valid log levels are {', '.join(LEVELS)}",
            )


def apply_ops(ops: Iterable[tuple[str, int, str | None]]) -> None:
    """Set or remove the levels (checked first with ``check_ops``)."""
    for name, op, value in ops:
        logger = _logger(name)
        assert logger is not None, name
        if op == ConfigOp.SET:
            assert value is not None
            logger.setLevel(LEVELS[value])
            logging.getLogger(__name__).info("the level of logger %s is now %s", name, value)
        else:
            logger.setLevel(logging.NOTSET)  # its parent's again
            logging.getLogger(__name__).info("logger %s takes its parent's level again", name)
