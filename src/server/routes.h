/* routes.h: the route handlers (routes*.c) and what they share. A handler always fills the
 * response: a result, or an OpenAI-shaped error naming the field at fault. */
#ifndef LATHE_SERVER_ROUTES_H
#define LATHE_SERVER_ROUTES_H

#include <jansson.h>

#include "server/server_impl.h"

typedef void (*srv_route_fn)(struct srv_app *app, const struct srv_request *rq,
                             struct srv_response *rs);

/* The engine is READY; otherwise answers 503 and returns false. */
bool srv_require_ready(struct srv_app *app, struct srv_response *rs);
/* A JSON string of s[0..n), bytes that are not UTF-8 replaced by U+FFFD. */
json_t *srv_json_text(const char *s, size_t n);
/* Token ids from a JSON array (each an integer in the vocabulary); *out malloc'd. */
int srv_token_array(struct srv_app *app, const json_t *arr, const char *name, lt_token **out,
                    size_t *n);

/* routes_complete.c; srv_chat_prompt in routes_chat.c */
void srv_route_chat(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);
void srv_route_completions(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs);

/* For llama.cpp's /completion: the sampling fields, stop strings, adapters ("lora") and
 * prompt (string or token ids) of a /v1/completions-shaped body whose fields are checked,
 * into p (the caller frees it). */
int srv_completion_params(struct srv_app *app, const json_t *body, struct srv_gen_params *p);
/* The chat prompt's tokens from a body's "messages" (and chat_template_kwargs, tools,
 * tool_choice), rendered as /v1/chat/completions renders them. */
int srv_chat_prompt(struct srv_app *app, const json_t *body, struct lt_tokens *out);
/* routes_chat.c: the same with the request's tools already read (NULL: none). */
struct srv_tools;
int srv_chat_prompt_tools(struct srv_app *app, const json_t *body, const struct srv_tools *tools,
                          struct lt_tokens *out);
/* routes_tools.c: a chat request's tools, as given to the template and the output reader */
struct srv_tools {
    char *tools;   /* the JSON text of `tools` for the template; NULL: none rendered */
    char *prefill; /* the start of a forced call (tool_choice required or named); NULL: none */
    bool parse;    /* read the output for tool calls */
};
/* Checks `tools` and `tool_choice` (400 naming the field) and fills out. */
int srv_tools_read(const json_t *body, enum lt_chat_kind kind, struct srv_tools *out);
void srv_tools_free(struct srv_tools *t);
/* A message's `tool_calls` checked (assistant only; arguments the JSON text of an object),
 * as JSON text for lt_chat_message.tool_calls (*out malloc'd; NULL when none). */
int srv_message_tool_calls(const json_t *m, const char *where, char **out);
/* The whole response's message from the model's text (after the prefill); *called when it
 * holds tool calls (finish_reason "tool_calls"). */
json_t *srv_tool_message(const struct srv_tools *t, enum lt_chat_kind kind, const char *text,
                         size_t len, uint64_t (*random)(void), bool *called);
/* A stream's last deltas (a JSON array of delta objects) from the text held back since the
 * first possible call (prefill included when `with_prefill`). */
json_t *srv_tool_deltas(const struct srv_tools *t, enum lt_chat_kind kind, bool with_prefill,
                        const char *text, size_t len, uint64_t (*random)(void), bool *called);

/* routes_grammar.c: the grammar a completion body asks for, with llama.cpp's `grammar`
 * (GBNF) or `json_schema`, or OpenAI's `response_format` (json_object, json_schema; text
 * is none): *out is NULL when none; a bad grammar or schema is 400 naming the problem. */
int srv_read_grammar(const json_t *body, struct lt_grammar **out);
/* routes_logprobs.c: llama.cpp's "completion_probabilities" of g (requested with n_probs, which
 * srv_completion_params reads into p->logprobs): [{id, token, logprob, bytes, top_logprobs:
 * [{id, token, logprob, bytes}]}] for the tokens whose text starts before `visible`, from
 * record *from on (advanced past them); NULL when g records none. */
json_t *srv_completion_probabilities(struct srv_app *app, struct srv_gen *g, size_t visible,
                                     int n_probs, size_t *from);

/* routes_logprobs.c: OpenAI chat's [{token, logprob, bytes, top_logprobs: [...]}] of n
 * records (up to `top` alternatives each), or llama.cpp's n_probs entries (with ids) when
 * llama; OpenAI legacy's {tokens, token_logprobs, top_logprobs, text_offset}, offsets
 * counted from offset0 */
json_t *srv_lp_content_json(struct srv_app *app, const struct srv_token_lp *r, size_t n, int top,
                            bool llama);
json_t *srv_lp_legacy_json(struct srv_app *app, const struct srv_token_lp *r, size_t n, int top,
                           size_t offset0);

/* routes_native.c: llama.cpp's own routes */
void srv_route_props(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);
void srv_route_slots(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);
void srv_route_apply_template(struct srv_app *app, const struct srv_request *rq,
                              struct srv_response *rs);
void srv_route_completion(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs);
void srv_route_infill(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);

/* routes_embed.c: OpenAI's /v1/embeddings */
void srv_route_embeddings(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs);

/* routes_lora.c: "model" in a completion request. The base model's id, alias or file (or
 * any name with --any-model-id): 200 and *body_out NULL; an adapter loaded under that name,
 * or a finished fine-tuning job's fine_tuned_model (its adapter loaded from the train dir on
 * first use, at scale 0 so it applies to no other request): 200 and *body_out a malloc'd
 * copy of the body that chooses that adapter ("lora"); otherwise 404 model_not_found. A body
 * that is not a JSON object, or whose "model" is not a string, is left to the route. */
int srv_model_resolve(struct srv_app *app, const struct srv_request *rq, char **body_out,
                      size_t *len_out);
/* Appends /v1/models' entries for the adapters and the finished jobs to data. */
void srv_models_adapters(struct srv_app *app, json_t *data);
/* Loads the adapter file `name` from the train dir under that name (what /lora-adapters/load
 * does): 200, or the failure's status naming `name`. */
int srv_lora_load_named(struct srv_app *app, const char *name, float scale);

/* routes_train.c */
void srv_route_train_get(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
void srv_route_train_post(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs);
void srv_route_train_cancel(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs);
void srv_route_train_pause(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs);
void srv_route_train_resume(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs);
void srv_route_ft_list(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);
void srv_route_ft_create(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
void srv_route_ft_get(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);
void srv_route_ft_events(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
void srv_route_ft_cancel(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);

/* routes_files.c: OpenAI's /v1/files (fine-tuning data stored under the train dir) */
void srv_route_files_upload(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs);
void srv_route_files_list(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs);
void srv_route_files_get(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
void srv_route_files_content(struct srv_app *app, const struct srv_request *rq,
                             struct srv_response *rs);
void srv_route_files_delete(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs);
/* A fine-tuning job's training file: an uploaded file's id ("file-<hex>", into the stored
 * data's path) or, as before, a plain .jsonl name inside the train dir (srv_path_in_dir).
 * 200, or a 4xx naming `param`. */
int srv_file_resolve(struct srv_app *app, const char *name, const char *param, char *path,
                     size_t size);

/* routes_page.c */
void srv_route_page(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);

/* routes_lora.c */
void srv_route_lora_list(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
void srv_route_lora_scale(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs);
void srv_route_lora_load(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
/* the most entries a listing route answers with */
#define SRV_MAX_LISTED 1024

void srv_route_lora_files(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs);
void srv_route_lora_unload(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs);

#endif
