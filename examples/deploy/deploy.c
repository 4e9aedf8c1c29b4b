/* Run a model compiled by `polyonnx compile` with nothing but its library.
 *
 *   cc -O2 -o deploy examples/deploy/deploy.c -ldl
 *   ./deploy DIR/libNAME.so [INPUT.npy | INPUT.bin ...] [-o OUTDIR] [-t THREADS]
 *
 * Opens the library with dlopen (so one build serves every model), reads each input from
 * a .npy file, or from raw bytes in the model's dtype and dims, runs the model once, and
 * prints each output's dims and first values; with -o, writes OUTDIR/OUTPUT_NAME.npy too.
 * An input with symbolic dims (-1) takes them from its .npy file's shape. Inputs not given
 * are zeros. See docs/deploy.md. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct session session;
struct api {
    session *(*open)(int);
    void (*close)(session *);
    int (*input_count)(void), (*output_count)(void);
    const char *(*input_name)(int), *(*output_name)(int);
    int (*input_type)(int), (*output_type)(int), (*input_rank)(int), (*output_rank)(int);
    const int64_t *(*input_dims)(int), *(*output_dims)(int);
    int (*run)(session *, const void *const *, const int64_t *const *, void *const *, const size_t *);
    const char *(*error)(session *);
    int (*symbol_count)(void), (*input_symbol)(int, int); /* NULL in older libraries */
    int (*output_dims_at)(int, const int64_t *, int64_t *);
};

#define MAX_RANK 16
#define MAX_SYMBOLS 64

static const struct { int type; const char *descr; int size; } TYPES[] = {
    {1, "<f4", 4}, {2, "|u1", 1}, {3, "|i1", 1}, {4, "<u2", 2}, {5, "<i2", 2}, {6, "<i4", 4},
    {7, "<i8", 8}, {9, "|b1", 1}, {10, "<f2", 2}, {11, "<f8", 8}, {12, "<u4", 4}, {13, "<u8", 8},
};

static int type_index(int type) {
    for (size_t i = 0; i < sizeof TYPES / sizeof *TYPES; i++)
        if (TYPES[i].type == type) return (int)i;
    return -1;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "deploy: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

static void *symbol(void *lib, const char *name, const char *fn) {
    char full[256];
    snprintf(full, sizeof full, "%s_%s", name, fn);
    void *found = dlsym(lib, full);
    if (!found) die("the library lacks", full);
    return found;
}

static void load_api(struct api *a, void *lib, const char *n) {
    *(void **)&a->open = symbol(lib, n, "open");
    *(void **)&a->close = symbol(lib, n, "close");
    *(void **)&a->input_count = symbol(lib, n, "input_count");
    *(void **)&a->output_count = symbol(lib, n, "output_count");
    *(void **)&a->input_name = symbol(lib, n, "input_name");
    *(void **)&a->output_name = symbol(lib, n, "output_name");
    *(void **)&a->input_type = symbol(lib, n, "input_type");
    *(void **)&a->output_type = symbol(lib, n, "output_type");
    *(void **)&a->input_rank = symbol(lib, n, "input_rank");
    *(void **)&a->output_rank = symbol(lib, n, "output_rank");
    *(void **)&a->input_dims = symbol(lib, n, "input_dims");
    *(void **)&a->output_dims = symbol(lib, n, "output_dims");
    *(void **)&a->run = symbol(lib, n, "run");
    *(void **)&a->error = symbol(lib, n, "error");
    char full[320];
    const char *optional[] = {"symbol_count", "input_symbol", "output_dims_at"};
    void **slots[] = {(void **)&a->symbol_count, (void **)&a->input_symbol, (void **)&a->output_dims_at};
    for (int i = 0; i < 3; i++) {
        snprintf(full, sizeof full, "%s_%s", n, optional[i]);
        *slots[i] = dlsym(lib, full);
    }
}

/* NAME of ".../libNAME.so". */
static void library_name(const char *path, char *name, size_t room) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strncmp(base, "lib", 3) == 0) base += 3;
    snprintf(name, room, "%s", base);
    char *dot = strstr(name, ".so");
    if (dot) *dot = 0;
}

static size_t element_count(const int64_t *dims, int rank) {
    size_t count = 1;
    for (int d = 0; d < rank; d++) count *= (size_t)dims[d];
    return count;
}

/* The rank and dims of a .npy header's 'shape': (...); -1 if there is none. */
static int npy_shape(const char *text, int64_t *dims) {
    const char *at = strstr(text, "'shape': (");
    if (!at) return -1;
    at += strlen("'shape': (");
    int rank = 0;
    while (*at && *at != ')' && rank < MAX_RANK) {
        char *end;
        long long dim = strtoll(at, &end, 10);
        if (end == at) break;
        dims[rank++] = dim;
        at = end;
        while (*at == ',' || *at == ' ') at++;
    }
    return rank;
}

/* The dims of input i: as declared, the symbolic ones (-1) from the .npy file at `path`. */
static int input_shape(const struct api *api, int i, const char *path, int64_t *dims) {
    int rank = api->input_rank(i), symbolic = 0;
    for (int d = 0; d < rank; d++) symbolic |= (dims[d] = api->input_dims(i)[d]) < 0;
    if (!symbolic) return rank;
    FILE *f = path ? fopen(path, "rb") : NULL;
    char head[4096] = {0};
    if (!f || fread(head, 1, sizeof head - 1, f) < 10 || memcmp(head, "\x93NUMPY", 6) != 0)
        die("an input with symbolic dims needs a .npy file, which gives them", api->input_name(i));
    fclose(f);
    int64_t given[MAX_RANK];
    if (npy_shape(head + 10, given) != rank) die("the .npy file's rank is not the input's", path);
    for (int d = 0; d < rank; d++) {
        if (dims[d] >= 0 && given[d] != dims[d]) die("the .npy file's dims are not the input's", path);
        dims[d] = given[d];
    }
    return rank;
}

/* The dims of output o for the inputs' dims: NAME_output_dims_at with the symbols' values. */
static void output_shape(const struct api *api, int o, int64_t *const *in_dims, int64_t *dims) {
    int rank = api->output_rank(o), symbolic = 0;
    for (int d = 0; d < rank; d++) symbolic |= (dims[d] = api->output_dims(o)[d]) < 0;
    if (!symbolic) return;
    if (!api->symbol_count || !api->output_dims_at) die("the library is too old for symbolic dims", NULL);
    int64_t values[MAX_SYMBOLS];
    for (int k = 0; k < MAX_SYMBOLS; k++) values[k] = 1;
    for (int i = 0; i < api->input_count(); i++)
        for (int d = 0; d < api->input_rank(i); d++) {
            int k = api->input_symbol(i, d);
            if (k >= 0 && k < MAX_SYMBOLS) values[k] = in_dims[i][d];
        }
    if (api->output_dims_at(o, values, dims) != 0) die("no dims for an output", api->output_name(o));
}

/* Read `bytes` bytes of data from a .npy file (its header checked against descr) or a
 * raw file of exactly that size. */
static void read_input(const char *path, const char *descr, void *data, size_t bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    char magic[6];
    size_t header = 0;
    if (fread(magic, 1, 6, f) == 6 && memcmp(magic, "\x93NUMPY", 6) == 0) {
        unsigned char version[2], length[4];
        if (fread(version, 1, 2, f) != 2) die("bad .npy file", path);
        int wide = version[0] >= 2;
        if (fread(length, 1, wide ? 4 : 2, f) != (size_t)(wide ? 4 : 2)) die("bad .npy file", path);
        size_t size = length[0] | (size_t)length[1] << 8;
        if (wide) size |= (size_t)length[2] << 16 | (size_t)length[3] << 24;
        char *text = calloc(1, size + 1);
        if (!text || fread(text, 1, size, f) != size) die("bad .npy file", path);
        if (!strstr(text, descr) || strstr(text, "'fortran_order': True"))
            die("the .npy file is not C-ordered data of the input's dtype", path);
        free(text);
        header = ftell(f);
    } else {
        fseek(f, 0, SEEK_SET);
    }
    fseek(f, 0, SEEK_END);
    if ((size_t)ftell(f) - header != bytes) die("the file's size is not the input's", path);
    fseek(f, (long)header, SEEK_SET);
    if (fread(data, 1, bytes, f) != bytes) die("cannot read", path);
    fclose(f);
}

static void write_npy(const char *path, const char *descr, const int64_t *dims, int rank,
                      const void *data, size_t bytes) {
    char shape[512] = "", text[640];
    size_t used = 0;
    for (int d = 0; d < rank; d++)
        used += snprintf(shape + used, sizeof shape - used, "%lld,%s", (long long)dims[d],
                         d + 1 < rank ? " " : "");
    int n = snprintf(text, sizeof text, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, shape);
    int total = 10 + n + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot write", path);
    unsigned short length = (unsigned short)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(length & 0xff, f);
    fputc(length >> 8, f);
    fwrite(text, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, 1, bytes, f);
    fclose(f);
}

static void print_output(const char *name, int type, const int64_t *dims, int rank, const void *data) {
    printf("output %s [", name);
    for (int d = 0; d < rank; d++) printf(d ? ", %lld" : "%lld", (long long)dims[d]);
    printf("]:");
    size_t count = element_count(dims, rank), shown = count < 8 ? count : 8;
    for (size_t i = 0; i < shown; i++) {
        if (type == 1) printf(" %.9g", ((const float *)data)[i]);
        else if (type == 11) printf(" %.17g", ((const double *)data)[i]);
        else if (type == 7) printf(" %lld", (long long)((const int64_t *)data)[i]);
        else if (type == 6) printf(" %d", ((const int32_t *)data)[i]);
        else printf(" %02x", ((const unsigned char *)data)[i]);
    }
    printf("%s\n", count > shown ? " ..." : "");
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: deploy DIR/libNAME.so [INPUT.npy|INPUT.bin ...] [-o OUTDIR] [-t THREADS]", NULL);
    const char *outdir = NULL, *files[64];
    int threads = 0, given = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) outdir = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (given < 64) files[given++] = argv[i];
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) die("cannot open the library", dlerror());
    char name[256];
    library_name(argv[1], name, sizeof name);
    struct api api;
    load_api(&api, lib, name);
    session *s = api.open(threads);
    if (!s) die("cannot open a session", api.error(NULL));
    int inputs = api.input_count(), outputs = api.output_count();
    if (given > inputs) die("more input files than the model has inputs", NULL);
    void **in = calloc((size_t)inputs + 1, sizeof *in), **out = calloc((size_t)outputs + 1, sizeof *out);
    int64_t **in_dims = calloc((size_t)inputs + 1, sizeof *in_dims);
    int64_t **out_dims = calloc((size_t)outputs + 1, sizeof *out_dims);
    size_t *out_bytes = calloc((size_t)outputs + 1, sizeof *out_bytes);
    for (int i = 0; i < inputs; i++) {
        int t = type_index(api.input_type(i));
        if (t < 0) die("an input's dtype is not one this example reads", api.input_name(i));
        in_dims[i] = calloc(MAX_RANK, sizeof **in_dims);
        int rank = input_shape(&api, i, i < given ? files[i] : NULL, in_dims[i]);
        size_t bytes = element_count(in_dims[i], rank) * (size_t)TYPES[t].size;
        in[i] = calloc(1, bytes + 64);
        if (i < given) read_input(files[i], TYPES[t].descr, in[i], bytes);
    }
    for (int o = 0; o < outputs; o++) {
        int t = type_index(api.output_type(o));
        if (t < 0) die("an output's dtype is not one this example writes", api.output_name(o));
        out_dims[o] = calloc(MAX_RANK, sizeof **out_dims);
        output_shape(&api, o, in_dims, out_dims[o]);
        out_bytes[o] = element_count(out_dims[o], api.output_rank(o)) * (size_t)TYPES[t].size;
        out[o] = calloc(1, out_bytes[o] + 64);
    }
    if (api.run(s, (const void *const *)in, (const int64_t *const *)in_dims, out, out_bytes) != 0)
        die("run failed", api.error(s));
    for (int o = 0; o < outputs; o++) {
        int t = type_index(api.output_type(o));
        print_output(api.output_name(o), api.output_type(o), out_dims[o], api.output_rank(o), out[o]);
        if (outdir) {
            char path[1024];
            int at = snprintf(path, sizeof path, "%s/", outdir);
            snprintf(path + at, sizeof path - (size_t)at, "%s.npy", api.output_name(o));
            for (char *c = path + at; *c; c++)
                if (*c == '/') *c = '_'; /* torch's names: "/fc/Gemm_output_0" */
            write_npy(path, TYPES[t].descr, out_dims[o], api.output_rank(o), out[o], out_bytes[o]);
        }
    }
    api.close(s);
    return 0;
}
