"""Node config: file and environment, flat and nested TOML, defaults, and every refusal naming
the key at fault."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcoord.node.config import (
    ConfigError,
    Endpoint,
    Listener,
    NodeConfig,
    Voter,
    config_entries,
    env_var_name,
    flatten_toml,
    load_config,
    parse_config,
    parse_voters,
    render_toml,
)

VOTERS_3 = "1@127.0.0.1:9094,2@127.0.0.2:9094,3@127.0.0.3:9094"


def _minimal(**overrides: object) -> dict[str, object]:
    values: dict[str, object] = {
        "node.id": 1,
        "controller.quorum.voters": "1@127.0.0.1:9094",
        "data.dir": "/var/lib/kcoord",
    }
    values.update(overrides)
    return {k: v for k, v in values.items() if v is not None}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    cfg = parse_config(_minimal())
    local = Endpoint("127.0.0.1", 9092)
    assert cfg.node_id == 1
    assert cfg.cluster_id is None
    assert cfg.kafka_listener == Listener(local, local)
    assert cfg.rpc_listener.bind == cfg.rpc_listener.advertised == Endpoint("127.0.0.1", 9093)
    assert cfg.quorum_listener.bind == cfg.quorum_listener.advertised == Endpoint("127.0.0.1", 9094)
    assert cfg.admin_listener.bind == Endpoint("127.0.0.1", 8080)
    assert cfg.voters == (Voter(1, "127.0.0.1", 9094),)
    assert cfg.data_dir == Path("/var/lib/kcoord")
    assert cfg.broker_heartbeat_interval_ms == 500
    assert cfg.broker_session_timeout_ms == 3000
    assert cfg.offsets_topic_num_partitions == 50
    assert cfg.offsets_topic_replication_factor == 3
    assert cfg.default_replication_factor == 1
    assert cfg.num_partitions == 1
    assert cfg.min_insync_replicas == 2  # DESIGN §5, not Kafka's 1
    assert cfg.replica_lag_time_max_ms == 4000
    assert cfg.group_initial_rebalance_delay_ms == 3000
    assert cfg.group_min_session_timeout_ms == 6000
    assert cfg.group_max_session_timeout_ms == 1_800_000
    assert cfg.group_max_size == 2**31 - 1
    assert cfg.offsets_retention_minutes == 10080
    # KAFKA-FACTS §1.6: Kafka's values (the append linger is adaptive, -1, by design).
    assert cfg.offsets_retention_check_interval_ms == 600_000
    assert cfg.offsets_commit_timeout_ms == 5000
    assert cfg.offsets_topic_segment_bytes == 100 * 2**20
    assert cfg.offsets_load_buffer_size == 5 * 2**20
    assert cfg.offset_metadata_max_bytes == 4096
    assert cfg.group_coordinator_append_linger_ms == -1
    assert cfg.group_consumer_session_timeout_ms == 45_000
    assert cfg.group_consumer_heartbeat_interval_ms == 5_000
    assert cfg.group_consumer_max_size == 2**31 - 1
    assert cfg.auto_create_topics_enable is True
    assert cfg.producer_id_expiration_ms == 86_400_000
    assert cfg.producer_id_expiration_check_interval_ms == 600_000
    assert (cfg.socket_request_max_bytes, cfg.connections_max_idle_ms) == (100 * 2**20, 600_000)
    assert cfg.quorum_leader_fallback_timeout_ms == 1500
    assert cfg.quorum_connection_retry_ms == 1000
    assert cfg.quorum_raft_min_timeout_ms == 400
    assert cfg.quorum_raft_max_timeout_ms == 1400
    assert cfg.self_voter == Voter(1, "127.0.0.1", 9094)
    assert cfg.peer_voters == ()


def test_flat_and_nested_toml_mean_the_same(tmp_path: Path) -> None:
    flat = _write(
        tmp_path,
        f"""
"node.id" = 2
"controller.quorum.voters" = "{VOTERS_3}"
"log.dirs" = "/data"
"group.initial.rebalance.delay.ms" = 0
"auto.create.topics.enable" = false
""",
    )
    flat_cfg = load_config(flat, {})
    nested = _write(
        tmp_path,
        f"""
node.id = 2
controller.quorum.voters = "{VOTERS_3}"
auto.create.topics.enable = false

[log]
dirs = "/data"

[group.initial.rebalance.delay]
ms = 0
""",
    )
    assert load_config(nested, {}) == flat_cfg
    assert flat_cfg.node_id == 2
    assert flat_cfg.group_initial_rebalance_delay_ms == 0
    assert flat_cfg.auto_create_topics_enable is False
    assert flat_cfg.data_dir == Path("/data")
    assert flat_cfg.peer_voters == (Voter(1, "127.0.0.1", 9094), Voter(3, "127.0.0.3", 9094))


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
"node.id" = 1
"controller.quorum.voters" = "1@127.0.0.1:9094"
"data.dir" = "/from-file"
"broker.session.timeout.ms" = 4000
"num.partitions" = 3
""",
    )
    env = {
        "KCOORD_BROKER_SESSION_TIMEOUT_MS": "9000",
        "KCOORD_DATA_DIR": "/from-env",
        "KCOORD_AUTO_CREATE_TOPICS_ENABLE": "FALSE",
        "KCOORD_SOCKET_REQUEST_MAX_BYTES": "1048576",
        "KCOORD_CLUSTER_ID": "MkU3OEVBNTcwNTJENDM2Qk",
        "HOME": "/root",  # not ours: ignored
    }
    cfg = load_config(path, env)
    assert cfg.broker_session_timeout_ms == 9000
    assert cfg.data_dir == Path("/from-env")
    assert cfg.auto_create_topics_enable is False
    assert cfg.socket_request_max_bytes == 1_048_576
    assert cfg.cluster_id == "MkU3OEVBNTcwNTJENDM2Qk"
    assert cfg.num_partitions == 3  # from the file, not overridden


def test_environment_alone_is_enough() -> None:
    cfg = load_config(
        None,
        {
            "KCOORD_NODE_ID": "3",
            "KCOORD_CONTROLLER_QUORUM_VOTERS": VOTERS_3,
            "KCOORD_LOG_DIRS": "/d",
            "KCOORD_LISTENERS": "PLAINTEXT://127.0.0.3:9092",
            "KCOORD_ADVERTISED_LISTENERS": "kafka-3.example:19092",
            "KCOORD_RPC_LISTENER": "0.0.0.0:9093",
            "KCOORD_ADVERTISED_RPC_LISTENER": "kafka-3.example:19093",
        },
    )
    assert cfg.node_id == 3
    assert cfg.kafka_listener == Listener(
        Endpoint("127.0.0.3", 9092), Endpoint("kafka-3.example", 19092)
    )
    assert cfg.rpc_listener == Listener(
        Endpoint("0.0.0.0", 9093), Endpoint("kafka-3.example", 19093)
    )
    assert cfg.quorum_listener.advertised == Endpoint("127.0.0.3", 9094)


def test_env_var_names() -> None:
    assert env_var_name("node.id") == "KCOORD_NODE_ID"
    assert env_var_name("controller.quorum.voters") == "KCOORD_CONTROLLER_QUORUM_VOTERS"
    assert env_var_name("some-key.x") == "KCOORD_SOME_KEY_X"


def test_quorum_listener_defaults_to_own_voter_entry_and_may_bind_elsewhere() -> None:
    cfg = parse_config(_minimal(**{"node.id": 2, "controller.quorum.voters": VOTERS_3}))
    assert cfg.quorum_listener == Listener(Endpoint("127.0.0.2", 9094), Endpoint("127.0.0.2", 9094))
    cfg = parse_config(
        _minimal(
            **{"node.id": 2, "controller.quorum.voters": VOTERS_3, "quorum.listener": "[::]:7"}
        )
    )
    assert cfg.quorum_listener == Listener(Endpoint("::", 7), Endpoint("127.0.0.2", 9094))


def test_ipv6_endpoints() -> None:
    cfg = parse_config(
        _minimal(**{"controller.quorum.voters": "1@[::1]:9094", "listeners": "[::1]:9092"})
    )
    assert cfg.voters == (Voter(1, "::1", 9094),)
    assert str(cfg.kafka_listener.bind) == "[::1]:9092"
    assert str(cfg.voters[0]) == "1@[::1]:9094"


def test_config_error_str_is_key_colon_message() -> None:
    err = ConfigError("node.id", "required")
    assert str(err) == "node.id: required"
    assert (err.key, err.message) == ("node.id", "required")


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        ({"node.id": None}, "node.id", "required; set it in the file or KCOORD_NODE_ID"),
        ({"controller.quorum.voters": None}, "controller.quorum.voters", "required"),
        ({"data.dir": None}, "data.dir", "required (or log.dirs)"),
        ({"bogus.key": 1}, "bogus.key", "unknown config key"),
        ({"node.id": "1"}, "node.id", "expected an integer, got '1'"),
        ({"node.id": True}, "node.id", "expected an integer, got True"),
        ({"node.id": -1}, "node.id", "must be in 0..2147483647, got -1"),
        ({"num.partitions": 1.5}, "num.partitions", "expected an integer, got 1.5"),
        ({"auto.create.topics.enable": 1}, "auto.create.topics.enable", "expected a boolean"),
        ({"data.dir": 7}, "data.dir", "expected a string, got 7"),
        ({"offsets.topic.num.partitions": 0}, "offsets.topic.num.partitions", "got 0"),
        ({"offsets.topic.replication.factor": 40000}, "offsets.topic.replication.factor", "40000"),
        ({"min.insync.replicas": 0}, "min.insync.replicas", "must be in 1.."),
        ({"log.segment.bytes": 1048575}, "log.segment.bytes", "must be in 1048576.."),
        ({"log.retention.ms": -2}, "log.retention.ms", "got -2"),
        # KafkaConfig: -1 or at least 1 (0 deleted every rolled segment of the node's topics).
        ({"log.retention.ms": 0}, "log.retention.ms", "must be unlimited (-1) or"),
        ({"log.cleaner.dedupe.buffer.size": 1048576}, "log.cleaner.dedupe.buffer.size", "1048577"),
        ({"listeners": "localhost"}, "listeners", "expected HOST:PORT, got 'localhost'"),
        ({"listeners": "localhost:0"}, "listeners", "port must be in 1..65535, got 0"),
        ({"listeners": "localhost:65536"}, "listeners", "got 65536"),
        ({"listeners": "localhost:http"}, "listeners", "port must be a number"),
        ({"listeners": ":9092"}, "listeners", "missing host"),
        ({"listeners": "::1:9092"}, "listeners", "IPv6 host goes in brackets"),
        ({"listeners": "SSL://a:9092"}, "listeners", "only PLAINTEXT listeners"),
        ({"listeners": "PLAINTEXT://a:9092,PLAINTEXT://b:9092"}, "listeners", "one client"),
        ({"advertised.rpc.listener": "x"}, "advertised.rpc.listener", "expected HOST:PORT"),
        ({"admin.listener": "a b:80"}, "admin.listener", "invalid host 'a b'"),
        ({"controller.quorum.voters": "1@"}, "controller.quorum.voters", "expected HOST:PORT"),
        ({"controller.quorum.voters": "x@a:1"}, "controller.quorum.voters", "voter id must be"),
        ({"controller.quorum.voters": "127.0.0.1:9094"}, "controller.quorum.voters", "ID@HOST"),
        (
            {"controller.quorum.voters": "1@a:1,2@b:1"},
            "controller.quorum.voters",
            "need 1, 3 or 5 voters, got 2",
        ),
        (
            {"controller.quorum.voters": "1@a:1,1@b:1,3@c:1"},
            "controller.quorum.voters",
            "duplicate voter id 1",
        ),
        (
            {"controller.quorum.voters": "1@a:1,32769@b:1,3@c:1"},
            "controller.quorum.voters",
            "voter ids 1 and 32769 are equal modulo 32768",
        ),
        (
            {"controller.quorum.voters": "1@a:1,2@a:1,3@c:1"},
            "controller.quorum.voters",
            "duplicate voter address a:1",
        ),
        (
            {"controller.quorum.voters": "2@127.0.0.1:9094"},
            "controller.quorum.voters",
            "this node's id 1 is not among '2@127.0.0.1:9094'",
        ),
        (
            {"controller.quorum.voters": "1@0.0.0.0:9094"},
            "controller.quorum.voters",
            "cannot be dialled",
        ),
        (
            {"advertised.quorum.listener": "127.0.0.9:9094"},
            "advertised.quorum.listener",
            "must equal this node's entry in controller.quorum.voters (127.0.0.1:9094)",
        ),
        ({"listeners": "0.0.0.0:9092"}, "advertised.listeners", "cannot be dialled"),
        ({"rpc.listener": "127.0.0.1:9092"}, "rpc.listener", "clashes with listeners"),
        (
            {"admin.listener": "0.0.0.0:9094", "advertised.admin.listener": "a:1"},
            "admin.listener",
            "0.0.0.0:9094 clashes with quorum.listener (127.0.0.1:9094)",
        ),
        ({"admin.listener": "0.0.0.0:80"}, "advertised.admin.listener", "cannot be dialled"),
        ({"log.dirs": "/a"}, "log.dirs", "set together with data.dir"),
        ({"data.dir": None, "log.dirs": "/a,/b"}, "log.dirs", "one data directory"),
        ({"data.dir": " "}, "data.dir", "must not be empty"),
        ({"cluster.id": ""}, "cluster.id", "must not be empty"),
        (
            {"broker.heartbeat.interval.ms": 3000},
            "broker.heartbeat.interval.ms",
            "must be less than broker.session.timeout.ms (3000), got 3000",
        ),
        (
            {"replica.fetch.wait.max.ms": 5000},
            "replica.fetch.wait.max.ms",
            "must not exceed replica.lag.time.max.ms (4000), got 5000",
        ),
        (
            {"group.min.session.timeout.ms": 2_000_000},
            "group.min.session.timeout.ms",
            "must not exceed group.max.session.timeout.ms",
        ),
        (
            {"quorum.raft.min.timeout.ms": 1400},
            "quorum.raft.min.timeout.ms",
            "must be less than quorum.raft.max.timeout.ms (1400)",
        ),
        # KIP-848's bounds, in the order of Kafka's validateNewGroupCoordinatorConfigs.
        (
            {"group.consumer.session.timeout.ms": 6000},
            "group.consumer.session.timeout.ms",
            "must be greater than or equal to group.consumer.min.session.timeout.ms (45000), "
            "got 6000",
        ),
        (
            {"group.consumer.heartbeat.interval.ms": 20_000},
            "group.consumer.heartbeat.interval.ms",
            "must be less than or equal to group.consumer.max.heartbeat.interval.ms (15000)",
        ),
        (
            {"group.consumer.min.heartbeat.interval.ms": 16_000},
            "group.consumer.max.heartbeat.interval.ms",
            "must be greater than or equal to group.consumer.min.heartbeat.interval.ms (16000)",
        ),
        (
            {"group.consumer.max.session.timeout.ms": 40_000},
            "group.consumer.max.session.timeout.ms",
            "must be greater than or equal to group.consumer.min.session.timeout.ms (45000)",
        ),
        (
            {
                "group.consumer.heartbeat.interval.ms": 6000,
                "group.consumer.session.timeout.ms": 6000,
                "group.consumer.min.session.timeout.ms": 6000,
            },
            "group.consumer.heartbeat.interval.ms",
            "must be less than group.consumer.session.timeout.ms (6000), got 6000",
        ),
    ],
)
def test_invalid_values_name_the_key(overrides: dict[str, object], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_minimal(**overrides))
    assert info.value.key == key
    assert fragment in info.value.message
    assert str(info.value).startswith(f"{key}: ")


@pytest.mark.parametrize(
    ("name", "value", "key", "fragment"),
    [
        (
            "KCOORD_NODE_ID",
            "one",
            "node.id",
            "expected an integer, got 'one' (from KCOORD_NODE_ID)",
        ),
        ("KCOORD_NODE_ID", "1_0", "node.id", "expected an integer, got '1_0'"),
        ("KCOORD_NODE_ID", "\u0663", "node.id", "expected an integer"),  # Arabic-Indic 3
        ("KCOORD_AUTO_CREATE_TOPICS_ENABLE", "yes", "auto.create.topics.enable", "got 'yes'"),
        ("KCOORD_NUM_PARTITIONS", "0", "num.partitions", "must be in 1.."),
        ("KCOORD_NODEID", "1", "KCOORD_NODEID", "unknown config key (environment variable)"),
    ],
)
def test_invalid_environment_names_the_key(
    tmp_path: Path, name: str, value: str, key: str, fragment: str
) -> None:
    path = _write(tmp_path, render_toml(_minimal()))
    with pytest.raises(ConfigError) as info:
        load_config(path, {name: value})
    assert info.value.key == key
    assert fragment in info.value.message


def test_unknown_key_in_a_nested_table_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, render_toml(_minimal()) + "[broker.heartbeat]\ninterval = 5\n")
    with pytest.raises(ConfigError, match=r"^broker\.heartbeat\.interval: unknown config key$"):
        load_config(path, {})


def test_key_set_both_flat_and_nested_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, render_toml(_minimal()) + "[node]\nid = 2\n")
    with pytest.raises(ConfigError, match=r"^node\.id: set twice"):
        load_config(path, {})


def test_unreadable_or_invalid_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing, {})
    assert info.value.key == str(missing)
    assert "cannot read" in info.value.message
    bad = _write(tmp_path, '"node.id" = \n')
    with pytest.raises(ConfigError) as info:
        load_config(bad, {})
    assert info.value.key == str(bad)
    assert "not valid TOML" in info.value.message


def test_replace_cannot_build_an_invalid_config() -> None:
    cfg = parse_config(_minimal())
    with pytest.raises(ConfigError, match=r"^broker\.heartbeat\.interval\.ms: "):
        dataclasses.replace(cfg, broker_session_timeout_ms=100)
    with pytest.raises(ConfigError, match=r"^num\.partitions: "):
        dataclasses.replace(cfg, num_partitions=0)


def test_render_toml_round_trips(tmp_path: Path) -> None:
    voters = parse_voters(VOTERS_3)
    text = render_toml(
        {
            "node.id": 3,
            "controller.quorum.voters": voters,
            "data.dir": tmp_path / 'odd "dir"\\',
            "listeners": Endpoint("127.0.0.3", 19092),
            "auto.create.topics.enable": False,
            "cluster.id": "abc",
        }
    )
    assert text.splitlines()[0] == '"node.id" = 3'
    cfg = load_config(_write(tmp_path, text), {})
    assert cfg.voters == voters
    assert cfg.data_dir == tmp_path / 'odd "dir"\\'
    assert cfg.kafka_listener.bind == Endpoint("127.0.0.3", 19092)
    assert cfg.auto_create_topics_enable is False
    assert cfg.cluster_id == "abc"


def test_render_toml_refuses_unknown_keys_and_types() -> None:
    with pytest.raises(ConfigError, match=r"^node\.idd: unknown config key$"):
        render_toml({"node.idd": 1})
    with pytest.raises(TypeError, match=r"num\.partitions"):
        render_toml({"num.partitions": 1.0})


@given(st.text())
def test_render_toml_strings_survive_tomllib(text: str) -> None:
    rendered = render_toml({"cluster.id": text})
    assert tomllib.loads(rendered) == {"cluster.id": text}


def test_flatten_toml() -> None:
    assert flatten_toml({"a": {"b": {"c": 1}}, "a.d": 2, "e": [1]}) == {
        "a.b.c": 1,
        "a.d": 2,
        "e": [1],
    }


def test_every_plain_field_is_set_by_its_key() -> None:
    # A field added to NodeConfig without a key in the table fails here, not in production.
    cfg = parse_config(_minimal())
    assembled = {
        "node_id",
        "cluster_id",
        "voters",
        "data_dir",
        "admin_api_token",
        "max_connections_per_ip_overrides",
        "group_consumer_migration_policy",
        "group_consumer_assignors",
        "group_coordinator_rebalance_protocols",
        "log_message_timestamp_type",
        "compression_type",
    }
    for field in dataclasses.fields(NodeConfig):
        if field.name in assembled or field.name.endswith("_listener"):
            continue
        value = getattr(cfg, field.name)
        if isinstance(value, bool):
            new: object = not value
        else:
            # Down, where up would break a bound the default sits on (group.consumer.min.*).
            up = value < 2**31 - 1 and not field.name.startswith("group_consumer_min_")
            new = value + 1 if up else value - 1
        changed = parse_config(_minimal(**{field.name.replace("_", "."): new}))
        assert getattr(changed, field.name) == new, field.name


def test_consumer_group_migration_policy() -> None:
    assert parse_config(_minimal()).group_consumer_migration_policy == "bidirectional"
    for text, policy in (("UPGRADE", "upgrade"), ("disabled", "disabled")):
        cfg = parse_config(_minimal(**{"group.consumer.migration.policy": text}))
        assert cfg.group_consumer_migration_policy == policy
    with pytest.raises(ConfigError, match=r"^group\.consumer\.migration\.policy: must be one of"):
        parse_config(_minimal(**{"group.consumer.migration.policy": "sideways"}))


def test_consumer_group_assignors() -> None:
    """group.consumer.assignors: built-in assignors by name or Kafka's class name, in order
    (the first is the default), each once; nothing else."""
    key = "group.consumer.assignors"
    assert parse_config(_minimal()).group_consumer_assignors == ("uniform", "range")
    cls = "org.apache.kafka.coordinator.group.assignor.RangeAssignor"
    for text, names in (("range", ("range",)), (f" {cls} , uniform", ("range", "uniform"))):
        assert parse_config(_minimal(**{key: text})).group_consumer_assignors == names
    for text, message in (
        ("sticky", "'sticky' is not a built-in assignor"),
        ("com.example.MyAssignor", "kcoord runs no custom assignors"),
        (f"range,{cls}", "'range' is listed twice"),
        (" , ", "at least one assignor is required"),
    ):
        with pytest.raises(ConfigError, match=rf"^group\.consumer\.assignors: .*{message}"):
            parse_config(_minimal(**{key: text}))


def test_rebalance_protocols() -> None:
    """group.coordinator.rebalance.protocols: classic, with or without consumer."""
    key = "group.coordinator.rebalance.protocols"
    assert parse_config(_minimal()).group_coordinator_rebalance_protocols == (
        "classic",
        "consumer",
    )
    assert parse_config(_minimal(**{key: "CLASSIC"})).group_coordinator_rebalance_protocols == (
        "classic",
    )
    for text, message in (
        ("consumer", "Disabling the 'classic' protocol is not supported."),
        ("classic,share", "'share' is not a rebalance protocol kcoord has"),
    ):
        with pytest.raises(ConfigError, match=rf"^{key}: {message}"):
            parse_config(_minimal(**{key: text}))


def test_list_configs_take_a_toml_array_of_strings(tmp_path: Path) -> None:
    """Kafka's LIST configs: comma-separated, or in the file a TOML array of strings, which
    means the same; DescribeConfigs shows them comma-separated with Kafka's LIST type."""
    path = _write(
        tmp_path,
        'node.id = 1\ndata.dir = "/var/lib/kcoord"\n'
        'controller.quorum.voters = ["1@127.0.0.1:9094", "2@127.0.0.2:9094", "3@127.0.0.3:9094"]\n'
        'group.consumer.assignors = ["range", "uniform"]\n'
        'group.coordinator.rebalance.protocols = ["classic"]\n',
    )
    cfg = load_config(path, {})
    assert [v.node_id for v in cfg.voters] == [1, 2, 3]
    assert cfg.group_consumer_assignors == ("range", "uniform")
    assert cfg.group_coordinator_rebalance_protocols == ("classic",)
    assert cfg == parse_config(
        _minimal(
            **{
                "controller.quorum.voters": "1@127.0.0.1:9094,2@127.0.0.2:9094,3@127.0.0.3:9094",
                "group.consumer.assignors": "range,uniform",
                "group.coordinator.rebalance.protocols": "classic",
            }
        )
    )
    entries = {e.key: e for e in config_entries(cfg)}
    assert (
        entries["group.consumer.assignors"].value,
        entries["group.consumer.assignors"].type_name,
    ) == (
        "range,uniform",
        "LIST",
    )
    assert entries["controller.quorum.voters"].type_name == "LIST"
    for value in (["range", 7], [["range"]], 7):
        with pytest.raises(
            ConfigError,
            match=r"^group\.consumer\.assignors: expected a comma-separated string or an array of "
            r"strings, got",
        ):
            parse_config(_minimal(**{"group.consumer.assignors": value}))
    with pytest.raises(ConfigError, match=r"^data\.dir: expected a string, got \['a'\]"):
        parse_config(_minimal(**{"data.dir": ["a"]}))
    # A launcher writes such an array, and it reads back.
    written = _write(
        tmp_path,
        render_toml(
            {
                "node.id": 1,
                "data.dir": "/var/lib/kcoord",
                "controller.quorum.voters": "1@127.0.0.1:9094",
                "group.consumer.assignors": ["range", 'a"b'],
            }
        ),
    )
    assert 'group.consumer.assignors" = ["range", "a\\"b"]' in written.read_text()
    with pytest.raises(ConfigError, match="'a\"b' is not a built-in assignor"):
        load_config(written, {})
    with pytest.raises(TypeError, match="cannot render list"):
        render_toml({"data.dir": ["a"]})


def test_log_message_timestamp_configs() -> None:
    """Kafka 4.0's defaults (KIP-1030: records at most an hour ahead); the type is one of
    Kafka's two names, exactly as Kafka's TimestampType.forName takes them."""
    cfg = parse_config(_minimal())
    assert cfg.log_message_timestamp_type == "CreateTime"
    assert cfg.log_message_timestamp_before_max_ms == 2**63 - 1
    assert cfg.log_message_timestamp_after_max_ms == 3_600_000
    cfg = parse_config(_minimal(**{"log.message.timestamp.type": "LogAppendTime"}))
    assert cfg.log_message_timestamp_type == "LogAppendTime"
    with pytest.raises(ConfigError, match=r"^log\.message\.timestamp\.type: must be one of"):
        parse_config(_minimal(**{"log.message.timestamp.type": "logappendtime"}))


def test_compression_type() -> None:
    assert parse_config(_minimal()).compression_type == "producer"
    assert parse_config(_minimal(**{"compression.type": "zstd"})).compression_type == "zstd"
    with pytest.raises(ConfigError, match=r"^compression\.type: must be one of"):
        parse_config(_minimal(**{"compression.type": "brotli"}))


def test_admin_api_token_and_metrics_switch() -> None:
    cfg = parse_config(_minimal())
    assert cfg.admin_api_token is None and cfg.metrics_enable is True
    cfg = parse_config(_minimal(**{"admin.api.token": "s3cret", "metrics.enable": False}))
    assert cfg.admin_api_token == "s3cret" and cfg.metrics_enable is False
    for bad in ("", "two words", "tab\there"):
        with pytest.raises(ConfigError, match=r"^admin\.api\.token: "):
            parse_config(_minimal(**{"admin.api.token": bad}))


def test_max_connections_per_ip_and_its_overrides() -> None:
    """Kafka's ConnectionQuotas configs: "host:count" overrides by resolved address; 0 only
    with overrides, or nobody could connect (KafkaConfig.validateValues)."""
    from kcoord.node.config import per_ip_overrides

    cfg = parse_config(_minimal())
    assert cfg.max_connections_per_ip == 2**31 - 1
    assert per_ip_overrides(cfg.max_connections_per_ip_overrides) == {}
    text = "127.0.0.2:5, localhost:7,[::1]:3"
    cfg = parse_config(
        _minimal(**{"max.connections.per.ip": 0, "max.connections.per.ip.overrides": text})
    )
    assert cfg.max_connections_per_ip == 0
    assert per_ip_overrides(cfg.max_connections_per_ip_overrides) == {
        "127.0.0.2": 5,
        "127.0.0.1": 7,
        "::1": 3,
    }
    with pytest.raises(ConfigError, match=r"^max\.connections\.per\.ip: may be 0 only"):
        parse_config(_minimal(**{"max.connections.per.ip": 0}))
    for bad in ("127.0.0.1", "127.0.0.1:x", ":4", "127.0.0.1:-1"):
        with pytest.raises(ConfigError, match=r"^max\.connections\.per\.ip\.overrides: expected"):
            parse_config(_minimal(**{"max.connections.per.ip.overrides": bad}))


def test_connections_max_idle_ms_may_be_minus_one() -> None:
    assert parse_config(_minimal()).connections_max_idle_ms == 600_000
    cfg = parse_config(_minimal(**{"connections.max.idle.ms": -1}))
    assert cfg.connections_max_idle_ms == -1
    for bad in (0, -2):
        with pytest.raises(ConfigError, match=r"^connections\.max\.idle\.ms: "):
            parse_config(_minimal(**{"connections.max.idle.ms": bad}))
