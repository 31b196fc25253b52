// Delayed scaling's per-step state update on the device (Transformer Engine's
// amax history), so that a training step never waits for the host:
//   delayed_record: pending = max(pending, amax of the last quantize);
//   delayed_update: push pending into the circular history (length H), reset
//     it, and set scale = (fmax * 2^-margin) / (max of the history | most
//     recent), capped at the largest f32: the CPU's DelayedState::update bit
//     for bit. While that amax is not finite (an inf or NaN recorded: their
//     bits order above every finite value) or is 0, the scale is left as it
//     was.
// One thread each: the state is a few dozen bytes.

// state[0] = entries filled (<= H), state[1] = next slot.
extern "C" __global__ void delayed_record(unsigned int* pending_bits, const unsigned int* amax_bits) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        // Non-negative floats order like their bit patterns.
        *pending_bits = max(*pending_bits, *amax_bits);
    }
}

extern "C" __global__ void delayed_update(float* history, unsigned int* state, unsigned int* pending_bits,
                                          float* scale, int H, int most_recent, int margin, float fmax) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const float pending = __uint_as_float(*pending_bits);
    const unsigned int slot = state[1];
    history[slot] = pending;
    state[1] = (slot + 1) % H;
    if (state[0] < (unsigned int)H) state[0] += 1;
    *pending_bits = 0u;
    float amax = 0.f;
    bool finite = true;
    if (most_recent) {
        amax = pending;
        finite = !nonfinite_f32(pending);
    } else {
        for (unsigned int i = 0; i < state[0]; i++) {
            finite = finite && !nonfinite_f32(history[i]);
            amax = fmaxf(amax, history[i]);
        }
    }
    // A step of zeros (amax 0) keeps the scale too, as Transformer Engine does.
    if (!finite || amax == 0.f) return;
    // (fmax * 2^-margin) / amax, as octet_fp8::scale::scale_from_amax and
    // Transformer Engine: the margin applies before the f32 cap.
    // 2^-margin exactly (octet_fp8::scale::pow2).
    const int e = max(-149, min(127, -margin));
    const float p = e >= -126 ? __uint_as_float((unsigned int)(e + 127) << 23)
                              : __uint_as_float(1u << (e + 149));
    float s = __fdiv_rn(__fmul_rn(fmax, p), amax);
    if (nonfinite_f32(s)) s = 3.402823466e38f;
    *scale = s;
}
