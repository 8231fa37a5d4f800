"""Every span/metric attribute and metric name Engram emits, in one place.

Standard names follow the OpenTelemetry semantic conventions (HTTP and RPC come from
the instrumentation libraries; messaging and gen_ai are set by Engram's own code and
spelled here). Engram's own attributes all start with ``engram.``; docs/observability.md
lists them with their meaning. A new attribute gets a constant here first.
"""

from __future__ import annotations

from typing import Final

# -- messaging (JetStream) -------------------------------------------------------------
MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_SYSTEM_NATS: Final = "nats"
MESSAGING_DESTINATION_NAME: Final = "messaging.destination.name"
MESSAGING_DESTINATION_TEMPLATE: Final = "messaging.destination.template"
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
#: ``publish`` is the deprecated spelling of ``send`` in the current conventions.
MESSAGING_OPERATION_SEND: Final = "send"
MESSAGING_OPERATION_PROCESS: Final = "process"
MESSAGING_MESSAGE_ID: Final = "messaging.message.id"
MESSAGING_MESSAGE_BODY_SIZE: Final = "messaging.message.body.size"
MESSAGING_CONSUMER_GROUP_NAME: Final = "messaging.consumer.group.name"
MESSAGING_BATCH_MESSAGE_COUNT: Final = "messaging.batch.message_count"
MESSAGING_DELIVERY_COUNT: Final = "messaging.nats.message.delivery_count"

# -- gen_ai (LLM calls) -----------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_OPERATION_CHAT: Final = "chat"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
#: Deprecated in favour of ``gen_ai.provider.name``; still set for older backends.
GEN_AI_SYSTEM: Final = "gen_ai.system"
#: Engram speaks the OpenAI chat-completions API to whatever serves it.
GEN_AI_PROVIDER_OPENAI: Final = "openai"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
ERROR_TYPE: Final = "error.type"

# -- engram.* ---------------------------------------------------------------------------
ENGRAM_WORKER: Final = "engram.worker"  # worker name: ingest, reconcile, ...
ENGRAM_DELIVERY: Final = "engram.delivery"  # 1 on the first delivery of a message
ENGRAM_EVENT_ID: Final = "engram.event_id"
ENGRAM_TENANT: Final = "engram.tenant"
ENGRAM_CONVERSATION_ID: Final = "engram.conversation_id"
ENGRAM_LLM_TASK: Final = "engram.llm.task"  # extract, reconcile, summarize, episode, chat
ENGRAM_LLM_FALLBACK: Final = "engram.llm.fallback"  # no_model, unusable, unavailable
ENGRAM_LLM_OUTCOME: Final = "engram.llm.outcome"  # answered, or the fallback's kind
ENGRAM_SEARCH_STAGE: Final = "engram.search.stage"  # embed, candidates, rerank, mmr, total
ENGRAM_MEMORY_KIND: Final = "engram.memory.kind"  # turn, fact, profile, summary, episode
ENGRAM_MEMORY_OP: Final = "engram.memory.op"  # created, updated, superseded, deleted, evicted
ENGRAM_MEMORY_STATUS: Final = "engram.memory.status"  # gateway: used, empty, bypassed, ...
ENGRAM_MEMORY_HITS: Final = "engram.memory.hits"
# Set by the retrieval service's Search/Upsert child spans (embed, candidates, rerank, mmr).
ENGRAM_TOP_K: Final = "engram.top_k"
ENGRAM_EMBEDDING_MODEL: Final = "engram.embedding_model"
ENGRAM_SCOPES: Final = "engram.scopes"
ENGRAM_POOL_SIZE: Final = "engram.pool_size"
ENGRAM_LEXICAL: Final = "engram.lexical"
ENGRAM_CANDIDATE_SOURCES: Final = "engram.candidate_sources"
ENGRAM_CANDIDATES: Final = "engram.candidates"
ENGRAM_SCORER: Final = "engram.scorer"
ENGRAM_OUTCOME: Final = "engram.outcome"
ENGRAM_HITS: Final = "engram.hits"
ENGRAM_MMR_LAMBDA: Final = "engram.mmr_lambda"
ENGRAM_TEXTS: Final = "engram.texts"
ENGRAM_LATE_INTERACTION: Final = "engram.late_interaction"  # MaxSim blended into relevance

# -- metrics ----------------------------------------------------------------------------
# http.server.request.duration comes from the FastAPI instrumentation.
METRIC_RPC_SERVER_DURATION: Final = "rpc.server.call.duration"  # s
METRIC_RPC_CLIENT_DURATION: Final = "rpc.client.call.duration"  # s
RPC_SYSTEM: Final = "rpc.system"
RPC_SERVICE: Final = "rpc.service"
RPC_METHOD: Final = "rpc.method"
RPC_GRPC_STATUS_CODE: Final = "rpc.grpc.status_code"
METRIC_GEN_AI_DURATION: Final = "gen_ai.client.operation.duration"  # s
METRIC_GEN_AI_TOKENS: Final = "gen_ai.client.token.usage"  # {token}
METRIC_LLM_ERRORS: Final = "engram.llm.errors"  # {error}
METRIC_LLM_FALLBACKS: Final = "engram.llm.fallbacks"  # {fallback}
METRIC_LLM_TASKS: Final = "engram.llm.tasks"  # {task}
METRIC_SEARCH_STAGE_DURATION: Final = "engram.search.stage.duration"  # s
METRIC_EVENTS_PROCESSED: Final = "engram.events.processed"  # {event}
METRIC_EVENTS_REDELIVERED: Final = "engram.events.redelivered"  # {event}
METRIC_EVENTS_DEAD_LETTERED: Final = "engram.events.dead_lettered"  # {event}
METRIC_CONSUMER_PENDING: Final = "engram.consumer.pending"  # {message}
METRIC_DEAD_LETTERS: Final = "engram.dead_letters"  # {message}
METRIC_MEMORIES_CHANGED: Final = "engram.memories.changed"  # {memory}
