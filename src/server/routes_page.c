/* routes_page.c: GET /, the web page (web/index.html, compiled in by CMake as the bytes
 * srv_page_html; see cmake/embed_file.cmake).
 *
 * The page is one file with its CSS and JavaScript inline and calls only this server's own
 * routes, so it works with no network. The Content-Security-Policy says so to the browser
 * too: no script, style, image or connection from anywhere else, no framing. The page holds
 * no data, so it is served without an API key (like /health); every call it makes goes
 * through the guard as any client's would, with the key the user types into the page. */
#ifdef LATHE_HAVE_JANSSON
#include <stddef.h>

#include "server/routes.h"

extern const unsigned char srv_page_html[];
extern const size_t srv_page_html_len;

void srv_route_page(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    rs->status = 200;
    rs->content_type = "text/html; charset=utf-8";
    srv_response_header(rs, "Content-Security-Policy",
                        "default-src 'none'; script-src 'unsafe-inline'; style-src "
                        "'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; "
                        "form-action 'none'; frame-ancestors 'none'");
    srv_response_header(rs, "X-Content-Type-Options", "nosniff");
    srv_response_header(rs, "Cache-Control", "no-cache");
    if (lt_strbuf_append(&rs->body, (const char *)srv_page_html, srv_page_html_len) != LT_OK)
        srv_respond_error(rs, 503, NULL, NULL, "out of memory for the page");
}

#endif
