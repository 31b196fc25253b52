// The token embedding of a Llama training step: the forward gather and the
// deterministic backward scatter-add. Helpers: model.cuh.

// ---------------------------------------------------------------- embedding

// x (N, C) = table[tokens[n]] (f32 rows of the master table).
// Grid (N, C / 256).
extern "C" __global__ void embed_fwd(const float* table, const int* tokens, float* x, int C) {
    const int n = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c < C) x[(size_t)n * C + c] = table[(size_t)tokens[n] * C + c];
}

// dtable[v] += sum of dx rows whose token is v, in increasing row order
// (deterministic): `starts (V + 1)` and `rows (N)` list each token's rows
// (built on the host, where the tokens come from). Grid (V, C / 128).
extern "C" __global__ void embed_bwd(const float* dx, const int* starts, const int* rows, float* dtable, int C) {
    const int v = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int s = starts[v], e = starts[v + 1];
    if (s == e) return;
    float acc = 0.f;
    // Unrolled so that several rows' loads are in flight; the additions stay in row order.
#pragma unroll 8
    for (int i = s; i < e; i++) acc += dx[(size_t)rows[i] * C + c];
    dtable[(size_t)v * C + c] += acc;
}
