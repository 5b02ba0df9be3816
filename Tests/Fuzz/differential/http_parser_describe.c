/* Describes how Node's http_parser (Debian's libhttp-parser-dev) reads each file named on the command
 * line as an HTTP request head, one line per file, in the format of Tests/Fuzz/HTTPWire/FuzzEntry.swift:
 *   incomplete | error <name> | ok METHOD <target hex> <version> <framing> <head length> <fields>
 * scripts/fuzz --differential compares the two. Built and run only by that script. */
#include <http_parser.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct state {
    char target[65536];
    size_t target_len;
    int fields;
    int last_was_value;
    int headers_done;
    char framing[64];
};

static int on_url(http_parser *p, const char *at, size_t len) {
    struct state *s = p->data;
    if (s->target_len + len > sizeof s->target) return 1;
    memcpy(s->target + s->target_len, at, len);
    s->target_len += len;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
    struct state *s = p->data;
    (void)at; (void)len;
    if (s->fields == 0 || s->last_was_value) s->fields++;
    s->last_was_value = 0;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
    struct state *s = p->data;
    (void)at; (void)len;
    s->last_was_value = 1;
    return 0;
}

static int on_headers_complete(http_parser *p) {
    struct state *s = p->data;
    s->headers_done = 1;
    if (p->flags & F_CHUNKED) snprintf(s->framing, sizeof s->framing, "chunked");
    else if (p->content_length != ULLONG_MAX && p->content_length > 0)
        snprintf(s->framing, sizeof s->framing, "length:%llu", (unsigned long long)p->content_length);
    else snprintf(s->framing, sizeof s->framing, "none");
    http_parser_pause(p, 1);
    return 0;
}

int main(int argc, char **argv) {
    static char buf[1 << 20];
    http_parser_settings settings;
    memset(&settings, 0, sizeof settings);
    settings.on_url = on_url;
    settings.on_header_field = on_header_field;
    settings.on_header_value = on_header_value;
    settings.on_headers_complete = on_headers_complete;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) { perror(argv[i]); return 2; }
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        struct state s;
        memset(&s, 0, sizeof s);
        http_parser p;
        http_parser_init(&p, HTTP_REQUEST);
        p.data = &s;
        size_t used = http_parser_execute(&p, &settings, buf, n);
        enum http_errno err = HTTP_PARSER_ERRNO(&p);
        if (s.headers_done && err == HPE_PAUSED) {
            printf("ok %s ", http_method_str((enum http_method)p.method));
            for (size_t j = 0; j < s.target_len; j++) printf("%02x", (unsigned char)s.target[j]);
            /* Paused in on_headers_complete, the parser has not yet counted the final LF. */
            printf(" %d.%d %s %zu %d\n", p.http_major, p.http_minor, s.framing, used + 1, s.fields);
        } else if (err != HPE_OK) {
            printf("error %s\n", http_errno_name(err));
        } else {
            printf("incomplete\n");
        }
    }
    return 0;
}
