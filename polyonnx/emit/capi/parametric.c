/* A parametric library: one entry for every value of the model's symbolic dims, which are
 * isl parameters of its code (runtime/parametric.py). PNAME_run reads the symbols' values
 * off the inputs' dims, sizes every tensor from them (polynomials in the values: the
 * poly_* and term_* tables), plans the arena for them as runtime/memory.py does (best fit,
 * largest first, by the tensors' lifetimes), once per distinct values, and passes the
 * values the entry reads in its parameters slot. runtime.c comes before this text. */

static int open_kind(PNAME_session *s) {
    for (int k = 0; k < PNAME_SYMBOLS; k++) s->values[k] = s->planned[k] = -1;
    s->slots[PNAME_PARAMS_SLOT] = s->params;
    return OK;
}

API int PNAME_symbol_count(void) { return PNAME_SYMBOLS; }
API const char *PNAME_symbol_name(int k) { return in_range(k, PNAME_SYMBOLS) ? symbol_names[k] : NULL; }

API int PNAME_input_symbol(int i, int d) {
    if (!in_range(i, PNAME_INPUTS) || d < 0 || d >= input_ranks[i]) return -1;
    return input_symbols[i][d];
}

/* Polynomial p at the symbols' values; *ok cleared where a step overflows. */
static int64_t poly_at(int p, const int64_t *values, int *ok) {
    int64_t total = 0;
    for (int t = poly_starts[p]; t < poly_starts[p + 1]; t++) {
        int64_t term = term_coeffs[t];
        if (term_a[t] >= 0 && __builtin_mul_overflow(term, values[term_a[t]], &term)) *ok = 0;
        if (term_b[t] >= 0 && __builtin_mul_overflow(term, values[term_b[t]], &term)) *ok = 0;
        if (__builtin_add_overflow(total, term, &total)) *ok = 0;
    }
    return total;
}

/* The bytes of a tensor of `rank` dims (polynomials `polys`) of `itemsize`-byte
 * elements, its dims in `dims` if not NULL; *ok cleared on overflow or a negative dim. */
static uint64_t tensor_bytes(const int *polys, int rank, int itemsize, const int64_t *values,
                             int64_t *dims, int *ok) {
    uint64_t bytes = (uint64_t)itemsize;
    for (int d = 0; d < rank; d++) {
        int64_t dim = poly_at(polys[d], values, ok);
        if (dim < 0) *ok = 0;
        if (dims) dims[d] = dim;
        if (dim > 0 && __builtin_mul_overflow(bytes, (uint64_t)dim, &bytes)) *ok = 0;
        if (dim == 0) bytes = 0;
    }
    return bytes;
}

API int PNAME_output_dims_at(int i, const int64_t *values, int64_t *dims) {
    if (!dims || !in_range(i, PNAME_OUTPUTS) || (PNAME_SYMBOLS && !values)) return E_ARGUMENT;
    for (int k = 0; k < PNAME_SYMBOLS; k++)
        if (values[k] < 1) return E_ARGUMENT;
    int ok = 1;
    tensor_bytes(output_polys[i], output_ranks[i], output_itemsizes[i], values, dims, &ok);
    return ok ? OK : E_ARGUMENT;
}

API int PNAME_run_output_dims(PNAME_session *s, int i, int64_t *dims) {
    if (!s || !dims || !in_range(i, PNAME_OUTPUTS)) return E_ARGUMENT;
    if (s->samples < 0) {
        for (int d = 0; d < output_ranks[i]; d++) dims[d] = output_dims[i][d];
        return OK;
    }
    return PNAME_output_dims_at(i, s->values, dims);
}

API int PNAME_output_dims_for(int i, int64_t samples, int64_t *dims) {
    (void)i, (void)samples, (void)dims;
    return E_ARGUMENT; /* no batch: PNAME_output_dims_at */
}

/* Dim d of input i, given as `extent`, as the symbol it is: the first input to give a
 * symbol sets its value (from[k]), every other must agree. */
static int read_symbol(PNAME_session *s, int i, int d, int64_t extent, int64_t *values, int *from) {
    char text[ERROR_BYTES];
    int k = input_symbols[i][d];
    if (extent < 1) {
        snprintf(text, sizeof text, "input %d '%s': dim %d is the symbolic size '%s', which must be at least 1; given %lld",
                 i, input_names[i], d, symbol_names[k], (long long)extent);
        return fail(s, E_SHAPE, text);
    }
    if (from[k] >= 0 && values[k] != extent) {
        snprintf(text, sizeof text, "inputs %d '%s' and %d '%s' give the symbolic size '%s' different values: %lld and %lld",
                 from[k], input_names[from[k]], i, input_names[i], symbol_names[k],
                 (long long)values[k], (long long)extent);
        return fail(s, E_SHAPE, text);
    }
    values[k] = extent;
    from[k] = i;
    return OK;
}

/* Input i's dims checked against the model's; the symbols it gives read into values. */
static int check_dims(PNAME_session *s, int i, const int64_t *given, int64_t *values, int *from) {
    char text[ERROR_BYTES], want[256], got[256];
    for (int d = 0; d < input_ranks[i]; d++) {
        if (input_symbols[i][d] >= 0) {
            int code = read_symbol(s, i, d, given[d], values, from);
            if (code) return code;
        } else if (given[d] != input_dims[i][d]) {
            dims_text(want, sizeof want, input_dims[i], input_ranks[i]);
            dims_text(got, sizeof got, given, input_ranks[i]);
            snprintf(text, sizeof text, "input %d '%s': expected dims %s (-1: any size), given %s (dim %d must be %lld, is %lld)",
                     i, input_names[i], want, got, d, (long long)input_dims[i][d], (long long)given[d]);
            return fail(s, E_SHAPE, text);
        }
    }
    return OK;
}

static int has_symbol(int i) {
    for (int d = 0; d < input_ranks[i]; d++)
        if (input_symbols[i][d] >= 0) return 1;
    return 0;
}

/* Every input's dims and data; the symbols' values in `values`. */
static int check_inputs(PNAME_session *s, const void *const *inputs, const int64_t *const *given, int64_t *values) {
    char text[ERROR_BYTES];
    int from[PNAME_SYMBOLS + 1];
    for (int k = 0; k < PNAME_SYMBOLS; k++) from[k] = -1;
    for (int i = 0; i < PNAME_INPUTS; i++) {
        const int64_t *dims = given ? given[i] : NULL;
        if (!dims && has_symbol(i)) {
            snprintf(text, sizeof text, "input %d '%s' has a symbolic dim: give input_dims", i, input_names[i]);
            return fail(s, E_SHAPE, text);
        }
        int code = dims ? check_dims(s, i, dims, values, from) : OK;
        if (code) return code;
    }
    for (int k = 0; k < PNAME_SYMBOLS; k++)
        if (from[k] < 0) {
            snprintf(text, sizeof text, "no input gives the symbolic size '%s'", symbol_names[k]);
            return fail(s, E_SHAPE, text);
        }
    for (int i = 0; i < PNAME_INPUTS; i++) {
        int ok = 1;
        uint64_t bytes = tensor_bytes(input_polys[i], input_ranks[i], input_itemsizes[i], values, NULL, &ok);
        if (!ok) {
            snprintf(text, sizeof text, "input %d '%s': its dims are too large", i, input_names[i]);
            return fail(s, E_SHAPE, text);
        }
        int code = check_pointer(s, 1, i, inputs[i], bytes > 0);
        if (code) return code;
    }
    return OK;
}

static int check_outputs(PNAME_session *s, void *const *outputs, const size_t *output_bytes, const int64_t *values) {
    char text[ERROR_BYTES], shown[256];
    int64_t dims[PNAME_MAX_RANK];
    for (int i = 0; i < PNAME_OUTPUTS; i++) {
        int ok = 1;
        uint64_t need = tensor_bytes(output_polys[i], output_ranks[i], output_itemsizes[i], values, dims, &ok);
        if (!ok || need > SIZE_MAX) {
            snprintf(text, sizeof text, "output %d '%s': its dims at these sizes are too large", i, output_names[i]);
            return fail(s, E_SHAPE, text);
        }
        int code = check_pointer(s, 0, i, outputs[i], need > 0);
        if (code) return code;
        if (output_bytes[i] < need) {
            dims_text(shown, sizeof shown, dims, output_ranks[i]);
            snprintf(text, sizeof text, "output %d '%s': the buffer has %llu bytes, the output needs %llu (dims %s, %d bytes an element)",
                     i, output_names[i], (unsigned long long)output_bytes[i], (unsigned long long)need, shown,
                     output_itemsizes[i]);
            return fail(s, E_BUFFER, text);
        }
    }
    return OK;
}

static uint64_t aligned64(uint64_t n) { return n < 64 ? 64 : (n + 63) / 64 * 64; }

/* The offset of the smallest gap of `size` bytes among `count` taken ranges, sorted. */
static uint64_t best_fit(const uint64_t (*taken)[2], int count, uint64_t size) {
    uint64_t best = 0, best_gap = 0, cursor = 0;
    int found = 0;
    for (int c = 0; c < count; c++) {
        uint64_t gap = taken[c][0] > cursor ? taken[c][0] - cursor : 0;
        if (gap >= size && (!found || gap < best_gap)) best = cursor, best_gap = gap, found = 1;
        if (taken[c][1] > cursor) cursor = taken[c][1];
    }
    return found ? best : cursor;
}

/* Roots r and q in the order they are placed: largest first, then earliest first. */
static int placed_before(const uint64_t *bytes, int r, int q) {
    if (bytes[r] != bytes[q]) return bytes[r] > bytes[q];
    if (root_first[r] != root_first[q]) return root_first[r] < root_first[q];
    return r < q;
}

/* Insert range {lo, hi} into the `count` sorted ranges of `taken`. */
static void insert_range(uint64_t (*taken)[2], int count, uint64_t lo, uint64_t hi) {
    int c = count;
    while (c > 0 && (taken[c - 1][0] > lo || (taken[c - 1][0] == lo && taken[c - 1][1] > hi))) {
        taken[c][0] = taken[c - 1][0], taken[c][1] = taken[c - 1][1];
        c--;
    }
    taken[c][0] = lo, taken[c][1] = hi;
}

/* Each arena tensor's offset for `bytes`, placed in order; the arena's size. */
static uint64_t place_roots(const uint64_t *bytes, uint64_t *offsets) {
    static __thread int order[PNAME_ROOTS + 1];
    static __thread uint64_t taken[PNAME_ROOTS + 1][2];
    uint64_t total = 0;
    for (int r = 0; r < PNAME_ROOTS; r++) {
        int at = r;
        while (at > 0 && placed_before(bytes, r, order[at - 1])) order[at] = order[at - 1], at--;
        order[at] = r;
    }
    for (int n = 0; n < PNAME_ROOTS; n++) {
        int r = order[n], count = 0;
        uint64_t size = aligned64(bytes[r]);
        for (int m = 0; m < n; m++) {
            int q = order[m];
            if (root_last[q] < root_first[r] || root_last[r] < root_first[q]) continue;
            insert_range(taken, count++, offsets[q], offsets[q] + aligned64(bytes[q]));
        }
        offsets[r] = best_fit((const uint64_t (*)[2])taken, count, size);
        if (offsets[r] + size > total) total = offsets[r] + size;
    }
    return total;
}

/* The arena planned for `values` (kept until other values come). */
static int plan_arena(PNAME_session *s, const int64_t *values) {
    static __thread uint64_t bytes[PNAME_ROOTS + 1];
    char text[ERROR_BYTES];
    if (!memcmp(s->planned, values, sizeof(int64_t) * PNAME_SYMBOLS) && s->planned[0] >= 0)
        return OK;
    uint64_t sum = 0;
    for (int r = 0; r < PNAME_ROOTS; r++) {
        int ok = 1;
        bytes[r] = tensor_bytes(root_polys[r], root_ranks[r], root_itemsizes[r], values, NULL, &ok);
        if (!ok || __builtin_add_overflow(sum, aligned64(bytes[r]), &sum) || sum > (UINT64_C(1) << 62)) {
            snprintf(text, sizeof text, "the intermediates at these sizes are too large");
            return fail(s, E_SHAPE, text);
        }
    }
    uint64_t total = place_roots(bytes, s->offsets);
    if (total > s->arena_bytes) {
        void *arena = NULL;
        if (posix_memalign(&arena, 64, total) != 0) {
            snprintf(text, sizeof text, "out of memory: the intermediates need %llu bytes", (unsigned long long)total);
            return fail(s, E_MEMORY, text);
        }
        free(s->arena);
        s->arena = arena;
        s->arena_bytes = total;
    }
    memcpy(s->planned, values, sizeof(int64_t) * PNAME_SYMBOLS);
    return OK;
}

/* An output the entry does not compute: a copy of an input, a constant or another output. */
static void copy_output(int i, const void *const *inputs, void *const *outputs, const int64_t *values) {
    int ok = 1;
    uint64_t bytes = tensor_bytes(output_polys[i], output_ranks[i], output_itemsizes[i], values, NULL, &ok);
    const void *from = NULL;
    switch (output_copy_kind[i]) {
    case 1: from = inputs[output_copy_index[i]]; break;
    case 2: from = weights + constant_offsets[output_copy_index[i]]; break;
    case 3: from = outputs[output_copy_index[i]]; break;
    default: return;
    }
    if (bytes && from != outputs[i]) memmove(outputs[i], from, bytes);
}

API int PNAME_run(PNAME_session *s, const void *const *inputs, const int64_t *const *input_dims_given,
                  void *const *outputs, const size_t *output_bytes) {
    int code = start_run(s, inputs, outputs, output_bytes);
    if (code) return code;
    int64_t values[PNAME_SYMBOLS + 1];
    code = check_inputs(s, inputs, input_dims_given, values);
    if (!code) code = check_outputs(s, outputs, output_bytes, values);
    if (!code) code = plan_arena(s, values);
    if (code) return code;
    for (int k = 0; k < PNAME_PARAMS; k++) {
        int64_t other = param_b[k] >= 0 ? values[param_b[k]] : 1;
        if (__builtin_mul_overflow(values[param_a[k]], other, &s->params[k]))
            return fail(s, E_SHAPE, "the symbolic sizes are too large: their product overflows");
    }
    memcpy(s->values, values, sizeof(int64_t) * PNAME_SYMBOLS);
    s->samples = 1;
    for (int i = 0; i < PNAME_INPUTS; i++)
        if (input_slots[i] >= 0) s->slots[input_slots[i]] = (void *)inputs[i];
    for (int i = 0; i < PNAME_OUTPUTS; i++)
        if (output_slots[i] >= 0) s->slots[output_slots[i]] = outputs[i];
    for (int r = 0; r < PNAME_ROOTS; r++) s->slots[PNAME_ROOTS_SLOT + r] = (char *)s->arena + s->offsets[r];
    if (s->poison) memset(s->arena, 0xFF, s->arena_bytes);
    __atomic_store_n(&polyonnx_threads, s->threads, __ATOMIC_RELAXED);
    polyonnx_main(s->slots);
    if (s->errors[0]) return check_failed(s);
    for (int i = 0; i < PNAME_OUTPUTS; i++) copy_output(i, inputs, outputs, values);
    return OK;
}
