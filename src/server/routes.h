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

/* routes_complete.c */
void srv_route_chat(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);
void srv_route_completions(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs);

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

/* routes_page.c */
void srv_route_page(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);

/* routes_lora.c */
void srv_route_lora_list(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
void srv_route_lora_scale(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs);
void srv_route_lora_load(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs);
void srv_route_lora_unload(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs);

#endif
