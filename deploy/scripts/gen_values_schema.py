"""Generate deploy/helm/engram/values.schema.json (``--check``: fail if it is stale).

The schema is written as Python because every component shares most of its keys, and
JSON Schema's own reuse (``$ref`` + ``unevaluatedProperties``) makes Helm print a
"false schema" line for every valid key next to the one real error. Expanding the
shared keys here keeps ``additionalProperties: false`` and the messages short:
``- at '/components/ingest/replicas': got string, want integer``.

The workers' components (one per image; a worker sharing an image is a container in
that pod) come from the worker catalogue, ``engram_core.worker_catalog``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# The catalogue is pure data: any Python can run this script, with or without the venv.
sys.path.insert(0, str(REPO_ROOT / "libs" / "engram-core" / "src"))
from engram_core.worker_catalog import WORKER_CATALOG  # noqa: E402

SCHEMA_PATH = REPO_ROOT / "deploy" / "helm" / "engram" / "values.schema.json"


def obj(props: dict[str, Any], required: tuple[str, ...] = (), **kw: Any) -> dict[str, Any]:
    """A closed object: unknown keys are errors (typos must not be silently ignored)."""
    d: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        d["required"] = list(required)
    d["additionalProperties"] = False
    d.update(kw)
    return d


BOOL = {"type": "boolean"}
STR = {"type": "string"}
OBJ = {"type": "object"}
ARR_OBJ = {"type": "array", "items": {"type": "object"}}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
SECRETISH = "(?i)(_API_KEYS?|_PASSWORD|_SECRET|_TOKEN)$"
STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

defs = {
    "quantity": {"type": ["string", "number"], "pattern": "^[0-9.]+([eE][0-9]+|[munkKMGTPE]i?)?$"},
    "resourceList": {
        "type": "object",
        "propertyNames": {"enum": ["cpu", "memory", "ephemeral-storage"]},
        "additionalProperties": {"$ref": "#/$defs/quantity"},
    },
    "resources": obj(
        {"requests": {"$ref": "#/$defs/resourceList"}, "limits": {"$ref": "#/$defs/resourceList"}}
    ),
    "probe": obj(
        {
            "enabled": BOOL,
            "initialDelaySeconds": {"type": "integer", "minimum": 0},
            "periodSeconds": {"type": "integer", "minimum": 1},
            "timeoutSeconds": {"type": "integer", "minimum": 1},
            "failureThreshold": {"type": "integer", "minimum": 1},
        }
    ),
    "probes": obj({k: {"$ref": "#/$defs/probe"} for k in ("startup", "liveness", "readiness")}),
    "env": {
        "type": "object",
        "description": "Variables by name. Names that look secret are refused: use `secrets`.",
        "propertyNames": {"pattern": ENV_NAME},
        "patternProperties": {
            SECRETISH: {
                "const": "secret values go in `secrets` (or secrets.existingSecret), not in env"
            }
        },
        "additionalProperties": {"type": ["string", "number", "boolean"]},
    },
    "intOrPercent": {
        "oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": "^[0-9]+%$"}]
    },
    "autoscaling": obj(
        {
            "enabled": BOOL,
            "minReplicas": {"type": "integer", "minimum": 1},
            "maxReplicas": {"type": "integer", "minimum": 1},
            "targetCPUUtilizationPercentage": {
                "type": "integer",
                "minimum": 0,
                "maximum": 100,
                "description": "0: no CPU metric",
            },
            "jetstreamLag": obj(
                {
                    "enabled": BOOL,
                    "metricName": {"type": "string", "minLength": 1},
                    "stream": {"type": "string", "minLength": 1},
                    "consumer": STR,
                    "averageValue": {"type": "integer", "minimum": 1},
                    "extraSelector": STR_MAP,
                }
            ),
            "behavior": OBJ,
            "extraMetrics": ARR_OBJ,
        }
    ),
    "pdb": obj(
        {
            "enabled": BOOL,
            "minAvailable": {
                "$ref": "#/$defs/intOrPercent",
                "description": "wins over maxUnavailable when set",
            },
            "maxUnavailable": {"$ref": "#/$defs/intOrPercent"},
        }
    ),
    "persistence": obj(
        {
            "size": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?([KMGTPE]i?)?$"},
            "storageClassName": STR,
            "accessModes": {
                "type": "array",
                "minItems": 1,
                "items": {"enum": ["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"]},
            },
        },
        required=("size", "accessModes"),
    ),
}
COMPONENT = {
    "enabled": BOOL,
    "replicas": {"type": "integer", "minimum": 0},
    "image": obj({"repository": STR, "tag": STR}),
    "resources": {"$ref": "#/$defs/resources"},
    "podSecurityContext": OBJ,
    "securityContext": OBJ,
    "preStopSleepSeconds": {"type": "integer", "minimum": 0, "maximum": 300},
    "terminationGracePeriodSeconds": {"type": "integer", "minimum": 1},
    "probes": {"$ref": "#/$defs/probes"},
    "autoscaling": {"$ref": "#/$defs/autoscaling"},
    "pdb": {"$ref": "#/$defs/pdb"},
    "env": {"$ref": "#/$defs/env"},
    "extraEnv": ARR_OBJ,
    "podAnnotations": STR_MAP,
    "podLabels": STR_MAP,
    "nodeSelector": STR_MAP,
    "tolerations": ARR_OBJ,
    "affinity": OBJ,
    "topologySpreadConstraints": ARR_OBJ,
    "priorityClassName": STR,
}
WORKER = {
    **COMPONENT,
    "healthPort": PORT,
    "llm": {
        "type": "boolean",
        "description": "calls the LLM: gets ENGRAM_LLM_API_KEY and LLM egress",
    },
}
defs |= {
    "peers": {
        "type": "array",
        "items": {"type": "object"},
        "description": "NetworkPolicyPeer entries; empty: any",
    },
    "ports": {"type": "array", "minItems": 1, "items": PORT},
}

worker = {"$ref": "#/$defs/worker"}
# Only workers consume from JetStream, so only they may scale on consumer lag.
NO_LAG_AUTOSCALING = {
    "$ref": "#/$defs/autoscaling",
    "properties": {"jetstreamLag": {"properties": {"enabled": {"const": False}}}},
}
defs["worker"] = obj(WORKER, required=("enabled", "healthPort"))
#: The component whose pod is the single writer of the mirror's git tree.
SINGLE_WRITER = "file-mirror"


def single_writer(sidecars: dict[str, Any]) -> dict[str, Any]:
    return obj(
        {
            **WORKER,
            "replicas": {
                "type": "integer",
                "minimum": 0,
                "maximum": 1,
                "description": "0 or 1: the mirror is a single writer",
            },
            "autoscaling": {
                "$ref": "#/$defs/autoscaling",
                "properties": {
                    "enabled": {
                        "const": False,
                        "description": "the mirror is a single writer and cannot autoscale",
                    }
                },
            },
            "persistence": {"$ref": "#/$defs/persistence"},
            **sidecars,
        },
        required=("enabled", "healthPort", "persistence", *sidecars),
        description="The single writer of the mirror's git tree: one StatefulSet pod at most.",
    )


def worker_components() -> dict[str, Any]:
    """A component per worker image of the catalogue (engram_core.worker_catalog); a
    worker that shares another's image is a container in that pod, keyed by its name."""
    components: dict[str, Any] = {}
    for entry in WORKER_CATALOG:
        if entry.sidecar:
            continue
        sidecars = {
            other.name: obj(
                {
                    "enabled": BOOL,
                    "healthPort": PORT,
                    "resources": {"$ref": "#/$defs/resources"},
                    "env": {"$ref": "#/$defs/env"},
                },
                required=("enabled", "healthPort"),
            )
            for other in WORKER_CATALOG
            if other.sidecar and other.image == entry.image
        }
        if entry.image == SINGLE_WRITER:
            components[entry.image] = single_writer(sidecars)
        elif sidecars:
            raise SystemExit(
                f"{entry.image}: the chart runs sidecar workers only in the mirror's pod"
            )
        else:
            components[entry.image] = worker
    return components


components = obj(
    {
        "gateway": obj(
            {
                **COMPONENT,
                "autoscaling": NO_LAG_AUTOSCALING,
                "port": PORT,
                "llm": BOOL,
                "service": obj(
                    {"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}, "port": PORT},
                    required=("type", "port"),
                ),
                "ui": obj(
                    {"enabled": BOOL},
                    required=("enabled",),
                    description="The memory browser at /ui (ENGRAM_GATEWAY_UI)",
                ),
                "mcp": obj(
                    {"enabled": BOOL},
                    required=("enabled",),
                    description="The MCP server at /mcp (ENGRAM_GATEWAY_MCP)",
                ),
            },
            required=("enabled", "port", "service", "ui", "mcp"),
        ),
        "retrieval": obj(
            {
                **COMPONENT,
                "autoscaling": NO_LAG_AUTOSCALING,
                "port": PORT,
                "metricsPort": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 65535,
                    "description": "Prometheus /metrics port (ENGRAM_METRICS_PORT); 0: none",
                },
                "persistence": {"$ref": "#/$defs/persistence"},
            },
            required=("enabled", "port", "persistence"),
        ),
        **worker_components(),
    },
    required=("gateway", "retrieval", *worker_components()),
)

schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Engram Helm chart values",
    "type": "object",
    "additionalProperties": False,
    "required": ["image", "nats", "qdrant", "llm", "secrets", "components", "default"],
    "properties": {
        "global": OBJ,
        "nameOverride": STR,
        "fullnameOverride": STR,
        "image": obj(
            {
                "registry": STR,
                "repository": {"type": "string", "minLength": 1},
                "tag": STR,
                "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
            },
            required=("repository", "pullPolicy"),
        ),
        "imagePullSecrets": {"type": "array", "items": obj({"name": STR}, required=("name",))},
        "serviceAccount": obj({"create": BOOL, "name": STR, "annotations": STR_MAP}),
        "nats": obj(
            {
                "url": {
                    "type": "string",
                    "pattern": "^(nats|tls|ws|wss)://[^,]+(,(nats|tls|ws|wss)://[^,]+)*$",
                },
                "streamReplicas": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            required=("url",),
        ),
        "qdrant": obj(
            {
                "url": {
                    "type": "string",
                    "pattern": "^(https?://.+)?$",
                    "description": "empty: the embedded store on a PVC, one retrieval replica",
                },
                "collection": {"type": "string", "minLength": 1, "maxLength": 255},
            },
            required=("url", "collection"),
        ),
        "llm": obj(
            {"baseUrl": {"type": "string", "pattern": "^https?://"}, "model": STR},
            required=("baseUrl",),
        ),
        "secrets": obj(
            {
                "existingSecret": STR,
                "apiKeys": STR,
                "llmApiKey": STR,
                "qdrantApiKey": STR,
            }
        ),
        "config": obj(
            {
                "logLevel": {"enum": ["debug", "info", "warning", "error"]},
                "env": {"$ref": "#/$defs/env"},
            }
        ),
        "otel": obj(
            {
                "endpoint": {"type": "string", "pattern": "^(https?://.+)?$"},
                "protocol": {"enum": ["grpc", "http/protobuf"]},
                "pushMetrics": BOOL,
                "resourceAttributes": {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "number", "boolean"]},
                },
            }
        ),
        "default": obj(COMPONENT),
        "components": components,
        "ingress": obj(
            {
                "enabled": BOOL,
                "className": STR,
                "annotations": STR_MAP,
                "hosts": {
                    "type": "array",
                    "items": obj(
                        {
                            "host": STR,
                            "paths": {
                                "type": "array",
                                "minItems": 1,
                                "items": obj(
                                    {
                                        "path": {"type": "string", "pattern": "^/"},
                                        "pathType": {
                                            "enum": ["Prefix", "Exact", "ImplementationSpecific"]
                                        },
                                    },
                                    required=("path", "pathType"),
                                ),
                            },
                        },
                        required=("host",),
                    ),
                },
                "tls": ARR_OBJ,
            }
        ),
        "networkPolicy": obj(
            {
                "enabled": BOOL,
                "gatewayFrom": {"$ref": "#/$defs/peers"},
                "healthFrom": {"$ref": "#/$defs/peers"},
                "nats": obj({"to": {"$ref": "#/$defs/peers"}, "ports": {"$ref": "#/$defs/ports"}}),
                "qdrant": obj(
                    {"to": {"$ref": "#/$defs/peers"}, "ports": {"$ref": "#/$defs/ports"}}
                ),
                "llm": obj(
                    {
                        "cidrs": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "pattern": "^[0-9a-fA-F:.]+/[0-9]{1,3}$"},
                        },
                        "except": {
                            "type": "array",
                            "items": {"type": "string", "pattern": "^[0-9a-fA-F:.]+/[0-9]{1,3}$"},
                        },
                        "ports": {"$ref": "#/$defs/ports"},
                    }
                ),
                "otlp": obj({"to": {"$ref": "#/$defs/peers"}, "ports": {"$ref": "#/$defs/ports"}}),
                "dns": obj({"to": {"$ref": "#/$defs/peers"}, "ports": {"$ref": "#/$defs/ports"}}),
            }
        ),
        "tests": obj({"enabled": BOOL, "tenant": {"type": "string", "minLength": 1}}),
    },
    "$defs": defs,
    # Rules across keys. The templates `fail` with a longer message on the same rules
    # (for --skip-schema-validation), but `helm lint` only fails on the schema.
    "allOf": [
        {
            "$comment": "Without qdrant.url the embedded store allows one retrieval process.",
            "if": {"properties": {"qdrant": {"properties": {"url": {"const": ""}}}}},
            "then": {
                "properties": {
                    "components": {
                        "properties": {
                            "retrieval": {
                                "properties": {
                                    "replicas": {"maximum": 1},
                                    "autoscaling": {"properties": {"enabled": {"const": False}}},
                                }
                            }
                        }
                    }
                }
            },
        },
        {
            "$comment": "A named existingSecret excludes secret values in values.",
            "if": {
                "properties": {"secrets": {"properties": {"existingSecret": {"minLength": 1}}}},
            },
            "then": {
                "properties": {
                    "secrets": {
                        "properties": {
                            key: {"maxLength": 0}
                            for key in ("apiKeys", "llmApiKey", "qdrantApiKey")
                        }
                    }
                }
            },
        },
    ],
}


def render() -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> None:
    text = render()
    if "--check" in sys.argv[1:]:
        if not SCHEMA_PATH.is_file() or SCHEMA_PATH.read_text() != text:
            sys.exit(f"{SCHEMA_PATH} is stale: run python deploy/scripts/gen_values_schema.py")
        return
    SCHEMA_PATH.write_text(text)


if __name__ == "__main__":
    main()
