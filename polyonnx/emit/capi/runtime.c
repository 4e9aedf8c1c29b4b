/* The C API of a model compiled by polyonnx (docs/deploy.md). polyonnx writes the tables
 * above this text for one model and replaces PNAME with the model's name; the native
 * entry polyonnx_main and the worker pool come from the object file linked beside it. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if PNAME_WEIGHTS_FILE
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#endif

#define API __attribute__((visibility("default")))
#define ERROR_BYTES 1024

enum { OK = 0, E_ARGUMENT = 1, E_SHAPE = 2, E_BUFFER = 3, E_MEMORY = 4, E_RUN = 5 };

extern void polyonnx_main(void **slots);
extern int32_t polyonnx_threads;

/* A library runs its entry once per run (a static or parametric library: parametric.c)
 * or once per sample of a batch (batch.c); the session holds the state of both kinds. */
struct PNAME_session {
    int threads;
    int64_t samples; /* the batch of the last run whose checks passed; -1 before any */
    void *arena;
    uint64_t arena_bytes; /* what arena holds */
    void *slots[PNAME_SLOTS];
    void *scratch[PNAME_INPUTS + PNAME_OUTPUTS + 1]; /* one sample, for inputs then outputs */
    int64_t values[PNAME_SYMBOLS + 1]; /* the symbols' values of the last run; -1 before any */
    int64_t planned[PNAME_SYMBOLS + 1]; /* the values the arena is planned for */
    uint64_t offsets[PNAME_ROOTS + 1]; /* each arena tensor's offset at those values */
    int64_t params[PNAME_PARAMS + 1]; /* what the entry reads of the values */
    int poison; /* POLYONNX_POISON_ARENA: the arena is 0xFF before each run */
    int64_t errors[2]; /* the site and value of a run's first failed check, else zeros */
    char error[ERROR_BYTES];
};

/* Set up what the library's kind keeps in a session; 0, else open_error says why. */
static int open_kind(PNAME_session *s);
static __thread char open_error[ERROR_BYTES];
static const unsigned char *weights;
#if PNAME_WEIGHTS_FILE
static pthread_once_t weights_once = PTHREAD_ONCE_INIT;
static char weights_error[ERROR_BYTES];
#else
__asm__(".section .rodata\n.balign 64\n.hidden PNAME_embedded\nPNAME_embedded:\n"
        ".incbin \"" PNAME_WEIGHTS_PATH "\"\n.byte 0\n.text\n");
extern const unsigned char PNAME_embedded[] __attribute__((visibility("hidden")));
#endif

API int PNAME_input_count(void) { return PNAME_INPUTS; }
API int PNAME_output_count(void) { return PNAME_OUTPUTS; }

static int in_range(int i, int count) { return i >= 0 && i < count; }

API const char *PNAME_input_name(int i) { return in_range(i, PNAME_INPUTS) ? input_names[i] : NULL; }
API const char *PNAME_output_name(int i) { return in_range(i, PNAME_OUTPUTS) ? output_names[i] : NULL; }
API int PNAME_input_type(int i) { return in_range(i, PNAME_INPUTS) ? input_types[i] : 0; }
API int PNAME_output_type(int i) { return in_range(i, PNAME_OUTPUTS) ? output_types[i] : 0; }
API int PNAME_input_rank(int i) { return in_range(i, PNAME_INPUTS) ? input_ranks[i] : -1; }
API int PNAME_output_rank(int i) { return in_range(i, PNAME_OUTPUTS) ? output_ranks[i] : -1; }
API const int64_t *PNAME_input_dims(int i) { return in_range(i, PNAME_INPUTS) ? input_shown_dims[i] : NULL; }
API const int64_t *PNAME_output_dims(int i) { return in_range(i, PNAME_OUTPUTS) ? output_shown_dims[i] : NULL; }
API const char *PNAME_batch_name(void) { return PNAME_BATCH_NAME; }

#if PNAME_WEIGHTS_FILE
/* Map NAME.weights, found beside the library, once per process. */
static void map_weights(void) {
    Dl_info info;
    if (!dladdr((void *)&PNAME_input_count, &info) || !info.dli_fname) {
        snprintf(weights_error, ERROR_BYTES, "cannot find where the library lies");
        return;
    }
    char path[4096];
    const char *slash = strrchr(info.dli_fname, '/');
    int dir = slash ? (int)(slash - info.dli_fname) + 1 : 0;
    snprintf(path, sizeof path, "%.*s%s", dir, info.dli_fname, PNAME_WEIGHTS_NAME);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < PNAME_WEIGHTS_BYTES) {
        snprintf(weights_error, ERROR_BYTES, "cannot read %s (the weights, %llu bytes)", path,
                 (unsigned long long)PNAME_WEIGHTS_BYTES);
        if (fd >= 0) close(fd);
        return;
    }
    void *map = mmap(NULL, PNAME_WEIGHTS_BYTES, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(weights_error, ERROR_BYTES, "cannot map %s", path);
        return;
    }
    weights = map;
}
#endif

API const char *PNAME_error(PNAME_session *s) { return s ? s->error : open_error; }

API PNAME_session *PNAME_open(int threads) {
#if PNAME_WEIGHTS_FILE
    pthread_once(&weights_once, map_weights);
    if (!weights) {
        snprintf(open_error, ERROR_BYTES, "%s", weights_error);
        return NULL;
    }
#else
    weights = PNAME_embedded;
#endif
    PNAME_session *s = calloc(1, sizeof *s);
    if (!s || posix_memalign(&s->arena, 64, PNAME_ARENA_BYTES ? PNAME_ARENA_BYTES : 64) != 0) {
        snprintf(open_error, ERROR_BYTES, "out of memory: the session needs %llu bytes",
                 (unsigned long long)PNAME_ARENA_BYTES);
        free(s);
        return NULL;
    }
    if (threads < 1) threads = PNAME_DEFAULT_THREADS;
    if (threads < 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > 0 ? (int)cores : 1;
    }
    s->threads = threads;
    s->samples = -1;
    s->arena_bytes = PNAME_ARENA_BYTES ? PNAME_ARENA_BYTES : 64;
    const char *poison = getenv("POLYONNX_POISON_ARENA");
    s->poison = poison && *poison;
    if (open_kind(s) != OK) {
        PNAME_close(s);
        return NULL;
    }
    s->slots[PNAME_ERROR_SLOT] = s->errors;
    for (int c = 0; c < PNAME_CONSTANTS; c++)
        s->slots[constant_slots[c]] = (void *)(weights + constant_offsets[c]);
    return s;
}

API void PNAME_close(PNAME_session *s) {
    if (!s) return;
    for (int k = 0; k < PNAME_INPUTS + PNAME_OUTPUTS; k++) free(s->scratch[k]);
    free(s->arena);
    free(s);
}

static void dims_text(char *out, size_t room, const int64_t *dims, int rank) {
    size_t used = (size_t)snprintf(out, room, "[");
    for (int d = 0; d < rank && used < room; d++)
        used += (size_t)snprintf(out + used, room - used, d ? ", %lld" : "%lld", (long long)dims[d]);
    if (used < room) snprintf(out + used, room - used, "]");
}

static int fail(PNAME_session *s, int code, const char *text) {
    snprintf(s->error, ERROR_BYTES, "%s", text);
    return code;
}

/* The checks every run starts with: a session, and the arrays of pointers. */
static int start_run(PNAME_session *s, const void *const *inputs, void *const *outputs,
                     const size_t *output_bytes) {
    if (!s) {
        snprintf(open_error, ERROR_BYTES, "the session is NULL");
        return E_ARGUMENT;
    }
    s->error[0] = 0;
    if ((PNAME_INPUTS && !inputs) || (PNAME_OUTPUTS && (!outputs || !output_bytes)))
        return fail(s, E_ARGUMENT, "inputs, outputs and output_bytes must not be NULL");
    return OK;
}

/* The pointer of input i (`input`), else of output i: not NULL where it has bytes to hold,
 * aligned to its elements. */
static int check_pointer(PNAME_session *s, int input, int i, const void *data, int has_bytes) {
    char text[ERROR_BYTES];
    const char *kind = input ? "input" : "output", *what = input ? "data" : "buffer";
    const char *name = input ? input_names[i] : output_names[i];
    int itemsize = input ? input_itemsizes[i] : output_itemsizes[i];
    if (!data && has_bytes) {
        snprintf(text, sizeof text, "%s %d '%s': the %s pointer is NULL", kind, i, name, what);
        return fail(s, E_ARGUMENT, text);
    }
    if ((uintptr_t)data % (uintptr_t)itemsize) {
        snprintf(text, sizeof text, "%s %d '%s': the %s is not aligned to its %d-byte elements",
                 kind, i, name, what, itemsize);
        return fail(s, E_BUFFER, text);
    }
    return OK;
}

/* The message of the run-time check that failed (its site and value are in s->errors). */
static int check_failed(PNAME_session *s) {
    int64_t site = s->errors[0], value = s->errors[1];
    s->errors[0] = s->errors[1] = 0;
    for (int c = 0; c < PNAME_CHECKS; c++) {
        if (check_sites[c] != site) continue;
        if (check_shows[c])
            snprintf(s->error, ERROR_BYTES, "%s%lld%s", check_before[c], (long long)value, check_after[c]);
        else
            snprintf(s->error, ERROR_BYTES, "%s", check_before[c]);
        return E_RUN;
    }
    snprintf(s->error, ERROR_BYTES, "run-time check %lld failed on the value %lld", (long long)site,
             (long long)value);
    return E_RUN;
}

