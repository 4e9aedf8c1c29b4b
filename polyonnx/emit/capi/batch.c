/* A library of a batch (PNAME_BATCH_NAME not NULL) holds the entry of one sample, and
 * PNAME_run runs it once per sample. Sample n of a port's data for N samples is its
 * PNAME_runs runs of run_bytes bytes, run c at (c * N + n) * run_bytes: a pointer into
 * the caller's data where it is one run, else copied through the session's scratch. A
 * static library is the batch of one sample. runtime.c comes before this text. */

/* One sample's bytes of a port (its whole data when it is not batched). */
static uint64_t sample_bytes(const int64_t *runs, const uint64_t *run_bytes, int i) {
    return (uint64_t)runs[i] * run_bytes[i];
}

/* One sample's scratch buffers, for ports of a batch split into runs. */
static int open_kind(PNAME_session *s) {
    s->slots[PNAME_ARENA_SLOT] = s->arena;
    for (int k = 0; k < PNAME_INPUTS + PNAME_OUTPUTS; k++) {
        int in = k < PNAME_INPUTS, i = in ? k : k - PNAME_INPUTS;
        if (!(in ? input_scratch : output_scratch)[i]) continue;
        uint64_t bytes = in ? sample_bytes(input_runs, input_run_bytes, i)
                            : sample_bytes(output_runs, output_run_bytes, i);
        if (posix_memalign(&s->scratch[k], 64, bytes > 64 ? bytes : 64) != 0) {
            snprintf(open_error, ERROR_BYTES, "out of memory: the session needs %llu bytes more",
                     (unsigned long long)bytes);
            return E_MEMORY;
        }
    }
    return OK;
}

/* The dims of output i for a batch of `samples` (-1: none given yet). */
static void output_dims_of(int i, int64_t samples, int64_t *dims) {
    memcpy(dims, output_dims[i], sizeof(int64_t) * (size_t)output_ranks[i]);
    int axis = output_batch_axis[i];
    if (axis >= 0) dims[axis] = samples < 0 ? -1 : dims[axis] * samples;
}

/* Where the batch size comes from: the first batched input's dims. */
struct batch {
    int64_t samples;
    int from; /* that input, -1 before one */
    int64_t extent;
};

static int check_batch(PNAME_session *s, int i, const int64_t *given, struct batch *b) {
    char text[ERROR_BYTES];
    int axis = input_batch_axis[i];
    int64_t extent = given[axis], factor = input_batch_factor[i];
    if (extent < 0 || extent % factor) {
        snprintf(text, sizeof text, "input %d '%s': dim %d is the batch '%s' (%lld rows a sample), given %lld",
                 i, input_names[i], axis, PNAME_batch_name(), (long long)factor, (long long)extent);
        return fail(s, E_SHAPE, text);
    }
    if (b->from >= 0 && extent / factor != b->samples) {
        snprintf(text, sizeof text, "input %d '%s': dim %d is the symbolic size '%s', which input %d '%s' gave as %lld; here it is %lld",
                 i, input_names[i], axis, PNAME_batch_name(), b->from, input_names[b->from],
                 (long long)b->extent, (long long)extent);
        return fail(s, E_SHAPE, text);
    }
    uint64_t bytes = sample_bytes(input_runs, input_run_bytes, i);
    if (bytes && (uint64_t)(extent / factor) > SIZE_MAX / bytes) {
        snprintf(text, sizeof text, "input %d '%s': a batch of %lld is too large", i, input_names[i],
                 (long long)extent);
        return fail(s, E_SHAPE, text);
    }
    b->samples = extent / factor;
    b->from = i;
    b->extent = extent;
    return OK;
}

static int check_input(PNAME_session *s, int i, const void *data, const int64_t *given, struct batch *b) {
    char text[ERROR_BYTES], want[256], got[256];
    int axis = input_batch_axis[i];
    if (!given && axis >= 0) {
        snprintf(text, sizeof text, "input %d '%s' has a symbolic dim: give input_dims", i, input_names[i]);
        return fail(s, E_SHAPE, text);
    }
    int code = check_pointer(s, 1, i, data, !(axis >= 0 && given[axis] == 0));
    if (code) return code;
    if (!given) return OK;  /* as declared */
    for (int d = 0; d < input_ranks[i]; d++) {
        if (d == axis || given[d] == input_dims[i][d]) continue;
        dims_text(want, sizeof want, input_shown_dims[i], input_ranks[i]);
        dims_text(got, sizeof got, given, input_ranks[i]);
        snprintf(text, sizeof text, "input %d '%s': expected dims %s, given %s (dim %d must be %lld, is %lld)",
                 i, input_names[i], want, got, d, (long long)input_dims[i][d], (long long)given[d]);
        return fail(s, E_SHAPE, text);
    }
    return axis >= 0 ? check_batch(s, i, given, b) : OK;
}

static int check_output(PNAME_session *s, int i, const void *data, size_t bytes, int64_t samples) {
    char text[ERROR_BYTES], dims_shown[256];
    int64_t dims[PNAME_MAX_RANK];
    uint64_t one = sample_bytes(output_runs, output_run_bytes, i);
    if (output_batch_axis[i] >= 0 && one && (uint64_t)samples > SIZE_MAX / one) {
        snprintf(text, sizeof text, "output %d '%s': a batch of %lld is too large", i, output_names[i],
                 (long long)samples);
        return fail(s, E_SHAPE, text);
    }
    uint64_t need = output_batch_axis[i] >= 0 ? one * (uint64_t)samples : one;
    int code = check_pointer(s, 0, i, data, need > 0);
    if (code) return code;
    if (bytes < need) {
        output_dims_of(i, samples, dims);
        dims_text(dims_shown, sizeof dims_shown, dims, output_ranks[i]);
        snprintf(text, sizeof text, "output %d '%s': the buffer has %llu bytes, the output needs %llu (dims %s, %d bytes an element)",
                 i, output_names[i], (unsigned long long)bytes, (unsigned long long)need, dims_shown,
                 output_itemsizes[i]);
        return fail(s, E_BUFFER, text);
    }
    return OK;
}

/* Every argument checked; the batch size in *samples (1 for a library of no batch). */
static int check_run(PNAME_session *s, const void *const *inputs, const int64_t *const *input_dims_given,
                     void *const *outputs, const size_t *output_bytes, int64_t *samples) {
    struct batch b = {1, -1, 0};
    for (int i = 0; i < PNAME_INPUTS; i++) {
        int code = check_input(s, i, inputs[i], input_dims_given ? input_dims_given[i] : NULL, &b);
        if (code) return code;
    }
    for (int i = 0; i < PNAME_OUTPUTS; i++) {
        int code = check_output(s, i, outputs[i], output_bytes[i], b.samples);
        if (code) return code;
    }
    *samples = b.samples;
    return OK;
}

/* An output the entry does not compute: a copy of an input, a constant or another output. */
static void copy_output(PNAME_session *s, int i, const void *const *inputs, void *const *outputs) {
    uint64_t bytes = sample_bytes(output_runs, output_run_bytes, i);
    const void *from = NULL;
    switch (output_copy_kind[i]) {
    case 1: from = inputs[output_copy_index[i]]; break;
    case 2: from = s->slots[constant_slots[output_copy_index[i]]]; break;
    case 3: from = outputs[output_copy_index[i]]; break;
    default: return;
    }
    if (bytes && from != outputs[i]) memmove(outputs[i], from, bytes);
}

/* Sample n of input i, of `samples`: in the caller's data, or gathered into scratch (zeros
 * for no samples). */
static const void *input_sample(PNAME_session *s, int i, const void *data, int64_t n, int64_t samples) {
    if (input_batch_axis[i] < 0 || samples == 1) return data;
    char *scratch = s->scratch[i];
    if (samples == 0) return scratch;
    uint64_t run = input_run_bytes[i];
    if (input_runs[i] == 1) return (const char *)data + (uint64_t)n * run;
    for (int64_t c = 0; c < input_runs[i]; c++)
        memcpy(scratch + (uint64_t)c * run, (const char *)data + ((uint64_t)c * (uint64_t)samples + (uint64_t)n) * run, run);
    return scratch;
}

/* Where the entry writes sample n of output i: the caller's buffer, or scratch. */
static void *output_sample(PNAME_session *s, int i, void *data, int64_t n, int64_t samples) {
    if (output_batch_axis[i] < 0 || samples == 1) return data;
    if (samples == 0 || output_runs[i] > 1) return s->scratch[PNAME_INPUTS + i];
    return (char *)data + (uint64_t)n * output_run_bytes[i];
}

/* Sample n of output i from scratch to the caller's buffer, where it went there. */
static void scatter_output(PNAME_session *s, int i, void *data, int64_t n, int64_t samples) {
    if (output_batch_axis[i] < 0 || samples < 2 || output_runs[i] == 1) return;
    const char *scratch = s->scratch[PNAME_INPUTS + i];
    uint64_t run = output_run_bytes[i];
    for (int64_t c = 0; c < output_runs[i]; c++)
        memcpy((char *)data + ((uint64_t)c * (uint64_t)samples + (uint64_t)n) * run, scratch + (uint64_t)c * run, run);
}

/* Run sample n: the entry on its inputs and outputs, then the outputs it does not write. A
 * run of no samples (PNAME_RUN_EMPTY) ignores checks on its zeros. */
static int run_sample(PNAME_session *s, const void *const *inputs, void *const *outputs, int64_t n,
                      int64_t samples) {
    const void *in[PNAME_INPUTS + 1];
    void *out[PNAME_OUTPUTS + 1];
    for (int i = 0; i < PNAME_INPUTS; i++) {
        in[i] = input_sample(s, i, inputs[i], n, samples);
        if (input_slots[i] >= 0) s->slots[input_slots[i]] = (void *)in[i];
    }
    for (int i = 0; i < PNAME_OUTPUTS; i++) {
        out[i] = output_sample(s, i, outputs[i], n, samples);
        if (output_slots[i] >= 0) s->slots[output_slots[i]] = out[i];
    }
    if (s->poison) memset(s->arena, 0xFF, s->arena_bytes);
    polyonnx_main(s->slots);
    if (s->errors[0] && samples) return check_failed(s);
    s->errors[0] = s->errors[1] = 0;
    for (int i = 0; i < PNAME_OUTPUTS; i++) copy_output(s, i, in, out);
    for (int i = 0; i < PNAME_OUTPUTS; i++) scatter_output(s, i, outputs[i], n, samples);
    return OK;
}

API int PNAME_run(PNAME_session *s, const void *const *inputs, const int64_t *const *input_dims_given,
                  void *const *outputs, const size_t *output_bytes) {
    int code = start_run(s, inputs, outputs, output_bytes);
    if (code) return code;
    int64_t samples = 1;
    code = check_run(s, inputs, input_dims_given, outputs, output_bytes, &samples);
    if (code) return code;
    s->samples = samples;
    if (samples == 0)
        for (int i = 0; i < PNAME_INPUTS; i++)
            if (s->scratch[i]) memset(s->scratch[i], 0, sample_bytes(input_runs, input_run_bytes, i));
    __atomic_store_n(&polyonnx_threads, s->threads, __ATOMIC_RELAXED);
    int64_t runs = samples ? samples : PNAME_RUN_EMPTY;
    for (int64_t n = 0; n < runs; n++) {
        code = run_sample(s, inputs, outputs, n, samples);
        if (code) return code;
    }
    return OK;
}

API int PNAME_run_output_dims(PNAME_session *s, int i, int64_t *dims) {
    if (!s || !dims || !in_range(i, PNAME_OUTPUTS)) return E_ARGUMENT;
    output_dims_of(i, s->samples, dims);
    return OK;
}

API int PNAME_output_dims_for(int i, int64_t samples, int64_t *dims) {
    if (!dims || !in_range(i, PNAME_OUTPUTS) || samples < 0) return E_ARGUMENT;
    output_dims_of(i, samples, dims);
    return OK;
}

API int PNAME_symbol_count(void) { return PNAME_BATCH_NAME ? 1 : 0; }
API const char *PNAME_symbol_name(int k) { return k == 0 ? PNAME_BATCH_NAME : NULL; }

API int PNAME_input_symbol(int i, int d) {
    if (!in_range(i, PNAME_INPUTS) || d < 0 || d >= input_ranks[i]) return -1;
    return d == input_batch_axis[i] ? 0 : -1;
}

API int PNAME_output_dims_at(int i, const int64_t *values, int64_t *dims) {
    if (!PNAME_BATCH_NAME) return PNAME_output_dims_for(i, 1, dims);
    return values ? PNAME_output_dims_for(i, values[0], dims) : E_ARGUMENT;
}
