/* routes_files.c: OpenAI's /v1/files for fine-tuning data: upload (multipart/form-data,
 * purpose "fine-tune"), list, retrieve, content, delete; and the ids' resolution for
 * POST /v1/fine_tuning/jobs (srv_file_resolve).
 *
 * Storage: <train-dir>/files/file-<24 hex>.jsonl holds the bytes as uploaded and
 * file-<24 hex>.json beside it the file object (id, bytes, created_at, filename, purpose).
 * A file exists when its object does; the object is written after the data and removed
 * before it, so no object ever names missing data. Both are written to "NAME.tmp-XXXXXX"
 * (locked while written, as the GGUF writer does), fsynced and renamed, so a crash leaves a
 * temporary file, which the next start removes (srv_files_remove_stale), never a torn one.
 *
 * An upload is refused before anything is kept when it is not what a fine-tuning job would
 * accept: the data file is read and tokenized by the job's own code (the engine's
 * train_check, lt_train_data_check) and a bad example is named by its line. Only the
 * example's shape is checked here, with a window no example reaches; its length against a
 * job's window is checked when a job is created with it (routes_train.c).
 *
 * Ids come from the request's path, so only "file-" and exactly 24 lower-case hex digits
 * are ever made into a path: anything else is 404, whatever it holds ('/', "..", '%'). */
#ifdef LATHE_HAVE_JANSSON
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/multipart.h"
#include "server/routes.h"

#define FILES_SUBDIR "files"
#define FILE_ID_PREFIX "file-"
#define FILE_ID_HEX 24
#define FILE_ID_LEN (5 + FILE_ID_HEX)
#define FILE_TMP_TAG ".tmp-XXXXXX"
#define FILE_PURPOSE "fine-tune"
/* the window an upload is checked with: longer than any example, so only shape counts */
#define FILE_CHECK_WINDOW (1 << 20)

static bool srv_file_id_valid(const char *id)
{
    if (strncmp(id, FILE_ID_PREFIX, 5) != 0)
        return false;
    for (int i = 0; i < FILE_ID_HEX; i++) {
        char c = id[5 + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return id[FILE_ID_LEN] == 0;
}

/* <train-dir>/files[/ID EXT] into path; false when it does not fit. */
static bool file_path(const struct srv_app *app, const char *id, const char *ext, char *path,
                      size_t size)
{
    int w = id ? snprintf(path, size, "%s/" FILES_SUBDIR "/%s%s", app->train_dir, id, ext)
               : snprintf(path, size, "%s/" FILES_SUBDIR, app->train_dir);
    return w > 0 && (size_t)w < size;
}

static bool files_enabled(struct srv_app *app, struct srv_response *rs)
{
    if (app->train_dir)
        return true;
    srv_respond_error(rs, 403, NULL, "files_disabled",
                      "files are disabled: start lathe serve with --train-dir DIR");
    return false;
}

static json_t *file_object(const char *id, json_int_t bytes, json_int_t created_at,
                           json_t *filename /* stolen */)
{
    return json_pack("{s:s,s:s,s:I,s:I,s:o,s:s,s:s,s:n}", "id", id, "object", "file", "bytes",
                     bytes, "created_at", created_at, "filename", filename, "purpose", FILE_PURPOSE,
                     "status", "processed", "status_details");
}

/* The stored object of file `id` (valid), re-checked; NULL when there is none. */
static json_t *file_load(const struct srv_app *app, const char *id)
{
    char meta[1024], data[1024];
    struct stat sb;
    if (!file_path(app, id, ".json", meta, sizeof(meta)) ||
        !file_path(app, id, ".jsonl", data, sizeof(data)) || stat(data, &sb) != 0 ||
        !S_ISREG(sb.st_mode))
        return NULL;
    json_t *j = json_load_file(meta, JSON_REJECT_DUPLICATES, NULL);
    json_t *filename = json_object_get(j, "filename");
    const char *stored_id = json_string_value(json_object_get(j, "id"));
    if (!json_is_object(j) || !json_is_string(filename) ||
        !json_is_integer(json_object_get(j, "created_at")) || !stored_id ||
        strcmp(stored_id, id) != 0) {
        json_decref(j);
        return NULL;
    }
    json_t *obj =
        file_object(id, (json_int_t)sb.st_size,
                    json_integer_value(json_object_get(j, "created_at")), json_incref(filename));
    json_decref(j);
    return obj;
}

/* 404 in OpenAI's words for a file id that names nothing. */
static void respond_no_file(struct srv_response *rs, const char *id)
{
    srv_respond_error(rs, 404, "id", "file_not_found", "No such File object: %.100s", id);
}

/* ---- writing ---- */

static lt_status write_all(int fd, const char *data, size_t n, const char *path)
{
    while (n > 0) {
        ssize_t w = write(fd, data, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return lt_fail(LT_ERR_IO, "%s: %s", path, w < 0 ? strerror(errno) : "short write");
        data += w;
        n -= (size_t)w;
    }
    return fsync(fd) == 0 ? LT_OK : lt_fail(LT_ERR_IO, "%s: fsync: %s", path, strerror(errno));
}

/* Writes data[0..n) to a new "target.tmp-XXXXXX" (tmp, size bytes), held locked by *fd
 * until the caller closes it. On failure nothing is left and *fd is -1. */
static lt_status write_temp(const char *target, const char *data, size_t n, char *tmp, size_t size,
                            int *fd)
{
    *fd = -1;
    int w = snprintf(tmp, size, "%s" FILE_TMP_TAG, target);
    if (w < 0 || (size_t)w >= size)
        return lt_fail(LT_ERR_INVALID, "%s: the path is too long", target);
    int f = mkstemp(tmp);
    if (f < 0)
        return lt_fail(LT_ERR_IO, "%s: cannot create a temporary file: %s", target,
                       strerror(errno));
    (void)flock(f, LOCK_EX); /* srv_files_remove_stale skips a locked one */
    lt_status st = write_all(f, data, n, tmp);
    if (st != LT_OK) {
        unlink(tmp);
        close(f);
        return st;
    }
    *fd = f;
    return LT_OK;
}

/* The temporary file data_tmp, read and tokenized as a fine-tuning job would: 200, or the
 * failure naming the line of the uploaded file `filename`. */
static int check_data(struct srv_app *app, const char *data_tmp, const char *filename)
{
    if (!app->engine->iface->train_check)
        return 200;
    struct lt_train_params p = {.examples_path = data_tmp, .window = FILE_CHECK_WINDOW};
    struct lt_train_data_fault f;
    int st = app->engine->iface->train_check(app->engine, &p, &f);
    if (st == 200)
        return 200;
    if (f.example >= 0)
        return srv_fail(st, "file", "invalid_file",
                        "'%.100s' is not fine-tuning data this server accepts: line %d "
                        "(example %d): %s",
                        filename, f.line, f.example, f.reason);
    const char *msg = lt_last_error();
    size_t n = strlen(data_tmp); /* the server's own path is no business of the client */
    if (!strncmp(msg, data_tmp, n) && !strncmp(msg + n, ": ", 2))
        msg += n + 2;
    return srv_fail(st, "file", "invalid_file",
                    "'%.100s' is not fine-tuning data this server accepts: %s", filename, msg);
}

/* Renames tmp over target and syncs the directory; closes fd (the lock) either way. */
static lt_status commit_temp(const char *tmp, const char *target, const char *dir, int fd)
{
    lt_status st = LT_OK;
    if (rename(tmp, target) != 0) {
        st = lt_fail(LT_ERR_IO, "%s: cannot rename it: %s", tmp, strerror(errno));
        unlink(tmp);
    }
    close(fd);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return st;
}

/* A fresh id, 96 random bits. */
static int new_id(char id[FILE_ID_LEN + 1])
{
    unsigned char r[FILE_ID_HEX / 2];
    size_t got = 0;
    while (got < sizeof(r)) {
        ssize_t k = getrandom(r + got, sizeof(r) - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return srv_fail(503, NULL, NULL, "no random bytes for a file id: %s", strerror(errno));
        got += (size_t)k;
    }
    memcpy(id, FILE_ID_PREFIX, 5);
    for (size_t i = 0; i < sizeof(r); i++)
        snprintf(id + 5 + 2 * i, 3, "%02x", r[i]);
    return 200;
}

/* Stores the uploaded part (already checked to be a file) as a new file, validated first;
 * 200 and *obj its file object, or the failure's status, nothing left behind. */
static int store_upload(struct srv_app *app, const struct srv_part *file, json_t **obj)
{
    char dir[1024], data[1024], meta[1024], tmp[1100], id[FILE_ID_LEN + 1];
    *obj = NULL;
    if (!file_path(app, NULL, "", dir, sizeof(dir)))
        return srv_fail(500, NULL, NULL, "the train dir's path is too long");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return srv_fail(500, NULL, NULL, "cannot create %s: %s", dir, strerror(errno));
    int st = new_id(id);
    if (st != 200)
        return st;
    if (!file_path(app, id, ".jsonl", data, sizeof(data)) ||
        !file_path(app, id, ".json", meta, sizeof(meta)))
        return srv_fail(500, NULL, NULL, "the train dir's path is too long");
    int fd;
    if (write_temp(data, file->data, file->len, tmp, sizeof(tmp), &fd) != LT_OK)
        return srv_fail(500, NULL, NULL, "%s", lt_last_error());
    st = check_data(app, tmp, file->filename);
    if (st != 200) {
        unlink(tmp);
        close(fd);
        return st;
    }
    if (commit_temp(tmp, data, dir, fd) != LT_OK)
        return srv_fail(500, NULL, NULL, "%s", lt_last_error());
    json_t *o = file_object(id, (json_int_t)file->len, (json_int_t)srv_now_unix(),
                            srv_json_text(file->filename, strlen(file->filename)));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    lt_status ls = text ? write_temp(meta, text, strlen(text), tmp, sizeof(tmp), &fd)
                        : lt_fail(LT_ERR_NOMEM, "out of memory for the file object");
    if (ls == LT_OK)
        ls = commit_temp(tmp, meta, dir, fd);
    free(text);
    if (ls != LT_OK) {
        unlink(data);
        json_decref(o);
        return srv_fail(ls == LT_ERR_NOMEM ? 503 : 500, NULL, NULL, "%s", lt_last_error());
    }
    *obj = o;
    return 200;
}

/* ---- the routes ---- */

/* The upload's form: exactly the fields `file` (a file, not empty, no NUL byte) and
 * `purpose` ("fine-tune"); 200 with *file pointing into the body, or a 4xx naming the fault. */
static int upload_form(const struct srv_request *rq, struct srv_multipart *m,
                       const struct srv_part **file)
{
    char boundary[SRV_MULTIPART_MAX_BOUNDARY + 1];
    lt_status ls = srv_multipart_boundary(rq->content_type, boundary, sizeof(boundary));
    if (ls == LT_ERR_UNSUPPORTED)
        return srv_fail(415, NULL, "unsupported_media_type",
                        "POST /v1/files takes multipart/form-data with the fields 'file' and "
                        "'purpose': %s",
                        lt_last_error());
    if (ls == LT_OK)
        ls = srv_multipart_parse(boundary, rq->body, rq->body_len, m);
    if (ls != LT_OK)
        return srv_fail(400, NULL, "invalid_multipart",
                        "the upload is not valid multipart/form-data: %s", lt_last_error());
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->parts[i].name, "file") != 0 && strcmp(m->parts[i].name, "purpose") != 0)
            return srv_fail(400, m->parts[i].name, "unknown_field",
                            "unknown field '%s': an upload has the fields 'file' and 'purpose'",
                            m->parts[i].name);
    const struct srv_part *purpose = srv_multipart_get(m, "purpose");
    *file = srv_multipart_get(m, "file");
    if (!purpose)
        return srv_fail(400, "purpose", "missing_field", "missing field 'purpose'");
    if (purpose->len != strlen(FILE_PURPOSE) ||
        memcmp(purpose->data, FILE_PURPOSE, purpose->len) != 0)
        return srv_fail(400, "purpose", "invalid_value",
                        "purpose '%.*s' is not supported: this server stores only '" FILE_PURPOSE
                        "' files",
                        purpose->len > 64 ? 64 : (int)purpose->len, purpose->data);
    if (!*file)
        return srv_fail(400, "file", "missing_field", "missing field 'file'");
    if (!(*file)->has_filename)
        return srv_fail(400, "file", "invalid_type",
                        "the field 'file' must be a file upload (a part with a filename)");
    if ((*file)->len == 0)
        return srv_fail(400, "file", "invalid_value", "the file '%.100s' is empty",
                        (*file)->filename);
    const char *nul = memchr((*file)->data, 0, (*file)->len);
    if (nul)
        return srv_fail(400, "file", "invalid_file",
                        "the file '%.100s' holds a NUL byte at offset %zu; JSONL is text",
                        (*file)->filename, (size_t)(nul - (*file)->data));
    return 200;
}

void srv_route_files_upload(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs)
{
    if (!files_enabled(app, rs))
        return;
    if (rq->body_too_large) {
        srv_respond_error(rs, 413, "file", "file_too_large",
                          "the upload is larger than this server accepts (--max-upload-mib %zu)",
                          app->max_upload_bytes >> 20);
        return;
    }
    struct srv_multipart *m = malloc(sizeof(*m));
    if (!m) {
        srv_respond_error(rs, 503, NULL, NULL, "out of memory");
        return;
    }
    const struct srv_part *file = NULL;
    json_t *obj = NULL;
    int st = upload_form(rq, m, &file);
    if (st == 200 && !srv_require_ready(app, rs))
        goto out_free;
    if (st == 200)
        st = store_upload(app, file, &obj);
    if (st == 200)
        srv_respond_json(rs, 200, obj);
    else
        srv_respond_last_error(rs, st);
out_free:
    free(m);
}

static int created_desc(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    json_int_t tx = json_integer_value(json_object_get(x, "created_at"));
    json_int_t ty = json_integer_value(json_object_get(y, "created_at"));
    if (tx != ty)
        return tx < ty ? 1 : -1;
    return strcmp(json_string_value(json_object_get(x, "id")),
                  json_string_value(json_object_get(y, "id")));
}

void srv_route_files_list(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs)
{
    if (!files_enabled(app, rs))
        return;
    char dir[1024];
    json_t **found = NULL, *data = json_array();
    size_t n = 0, cap = 0;
    DIR *d = file_path(app, NULL, "", dir, sizeof(dir)) ? opendir(dir) : NULL;
    for (struct dirent *e = d ? readdir(d) : NULL; e && data; e = readdir(d)) {
        char id[FILE_ID_LEN + 1];
        if (strlen(e->d_name) != FILE_ID_LEN + 5 || strcmp(e->d_name + FILE_ID_LEN, ".json"))
            continue;
        memcpy(id, e->d_name, FILE_ID_LEN);
        id[FILE_ID_LEN] = 0;
        json_t *o = srv_file_id_valid(id) ? file_load(app, id) : NULL;
        if (o && n == cap) {
            json_t **grown = realloc(found, (cap = cap ? 2 * cap : 16) * sizeof(*found));
            if (!grown) {
                json_decref(o);
                break;
            }
            found = grown;
        }
        if (o)
            found[n++] = o;
    }
    if (d)
        closedir(d);
    if (n > 0)
        qsort(found, n, sizeof(*found), created_desc);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, found[i]);
    free(found);
    srv_respond_json(rs, 200,
                     json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", false));
}

void srv_route_files_get(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    if (!files_enabled(app, rs))
        return;
    json_t *o = srv_file_id_valid(rq->route_id) ? file_load(app, rq->route_id) : NULL;
    if (o)
        srv_respond_json(rs, 200, o);
    else
        respond_no_file(rs, rq->route_id);
}

void srv_route_files_content(struct srv_app *app, const struct srv_request *rq,
                             struct srv_response *rs)
{
    if (!files_enabled(app, rs))
        return;
    char path[1024];
    json_t *o = srv_file_id_valid(rq->route_id) ? file_load(app, rq->route_id) : NULL;
    FILE *f =
        o && file_path(app, rq->route_id, ".jsonl", path, sizeof(path)) ? fopen(path, "rb") : NULL;
    json_decref(o);
    if (!f) {
        respond_no_file(rs, rq->route_id);
        return;
    }
    struct lt_strbuf body = {0};
    char buf[1 << 16];
    bool ok = true;
    for (size_t k; ok && (k = fread(buf, 1, sizeof(buf), f)) > 0;)
        ok = lt_strbuf_append(&body, buf, k) == LT_OK;
    ok = ok && !ferror(f);
    fclose(f);
    if (!ok) {
        lt_strbuf_free(&body);
        srv_respond_error(rs, 500, NULL, NULL, "cannot read the file %s", rq->route_id);
        return;
    }
    rs->status = 200;
    rs->content_type = "application/octet-stream";
    rs->body = body;
}

void srv_route_files_delete(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs)
{
    if (!files_enabled(app, rs))
        return;
    char meta[1024], data[1024];
    bool named = srv_file_id_valid(rq->route_id) &&
                 file_path(app, rq->route_id, ".json", meta, sizeof(meta)) &&
                 file_path(app, rq->route_id, ".jsonl", data, sizeof(data));
    /* the object first: once it is gone the file is, whatever happens to the data */
    if (!named || unlink(meta) != 0) {
        respond_no_file(rs, rq->route_id);
        return;
    }
    unlink(data);
    srv_respond_json(
        rs, 200, json_pack("{s:s,s:s,s:b}", "id", rq->route_id, "object", "file", "deleted", true));
}

int srv_file_resolve(struct srv_app *app, const char *name, const char *param, char *path,
                     size_t size)
{
    if (strncmp(name, FILE_ID_PREFIX, 5) != 0 || strchr(name, '.'))
        return srv_path_in_dir(app->train_dir, name, ".jsonl", param, path, size);
    if (!app->train_dir)
        return srv_path_in_dir(NULL, name, ".jsonl", param, path, size); /* its 403 */
    json_t *o = srv_file_id_valid(name) ? file_load(app, name) : NULL;
    json_decref(o);
    if (!o || !file_path(app, name, ".jsonl", path, size))
        return srv_fail(400, param, "file_not_found",
                        "there is no uploaded file '%.100s' "
                        "(upload one with POST /v1/files)",
                        name);
    return 200;
}

/* ---- at start ---- */

/* dir/entry is a temporary file of ours no writer holds: removed. */
static bool remove_unheld(int dfd, const char *entry)
{
    int fd = openat(dfd, entry, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat sb;
    bool removed = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
                   flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dfd, entry, 0) == 0;
    close(fd);
    return removed;
}

/* "file-<hex>.json[l].tmp-XXXXXX": a temporary name of store_upload's. */
static bool is_temp_name(const char *s)
{
    char id[FILE_ID_LEN + 1];
    size_t n = strlen(s), tag = sizeof(FILE_TMP_TAG) - 1;
    if (n <= FILE_ID_LEN + tag)
        return false;
    memcpy(id, s, FILE_ID_LEN);
    id[FILE_ID_LEN] = 0;
    const char *ext = s + FILE_ID_LEN, *t = s + n - tag;
    size_t ext_len = (size_t)(t - ext);
    bool ext_ok =
        (ext_len == 5 && !strncmp(ext, ".json", 5)) || (ext_len == 6 && !strncmp(ext, ".jsonl", 6));
    return srv_file_id_valid(id) && ext_ok && !strncmp(t, ".tmp-", 5) &&
           strspn(t + 5, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 6;
}

/* "file-<hex>.jsonl" whose object is missing and which is older than a minute (so no
 * upload is between its two renames): the data of an upload that a crash interrupted. */
static bool remove_orphan(int dfd, const char *entry)
{
    char meta[FILE_ID_LEN + 8];
    struct stat sb, mb;
    if (strlen(entry) != FILE_ID_LEN + 6 || strcmp(entry + FILE_ID_LEN, ".jsonl") != 0)
        return false;
    snprintf(meta, sizeof(meta), "%.*s.json", FILE_ID_LEN, entry);
    meta[FILE_ID_LEN] = 0;
    if (!srv_file_id_valid(meta))
        return false;
    meta[FILE_ID_LEN] = '.';
    return fstatat(dfd, entry, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode) &&
           sb.st_uid == geteuid() && sb.st_mtime + 60 < time(NULL) &&
           fstatat(dfd, meta, &mb, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT &&
           unlinkat(dfd, entry, 0) == 0;
}

lt_status srv_files_remove_stale(const char *train_dir, int *n_removed)
{
    *n_removed = 0;
    char dir[1024];
    int w = snprintf(dir, sizeof(dir), "%s/" FILES_SUBDIR, train_dir);
    if (w < 0 || (size_t)w >= sizeof(dir))
        return lt_fail(LT_ERR_INVALID, "%s: the path is too long", train_dir);
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? LT_OK : lt_fail(LT_ERR_IO, "%s: %s", dir, strerror(errno));
    for (struct dirent *e = readdir(d); e; e = readdir(d))
        if ((is_temp_name(e->d_name) && remove_unheld(dirfd(d), e->d_name)) ||
            remove_orphan(dirfd(d), e->d_name))
            (*n_removed)++;
    closedir(d);
    return LT_OK;
}

#endif
