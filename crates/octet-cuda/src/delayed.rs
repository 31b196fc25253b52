//! Delayed scaling's state on the device (`kernels/delayed.cu`): the amax
//! history and the scale live in device memory; each quantize with the given
//! scale reports its amax there (`record`), and the end-of-step `update` rolls
//! the history and derives the next scale, bit-exact with the CPU's
//! [`octet_fp8::DelayedState`], with no host round trip.

use crate::{nvrtc, Error, Gpu, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use octet_fp8::{AmaxAlgo, DelayedState, Format};

/// The compiled state-update kernels.
pub(crate) struct DelayedKernels {
    record: CudaFunction,
    update: CudaFunction,
}

/// One role's delayed-scaling state on the device.
pub struct DeviceDelayed {
    history: CudaSlice<f32>,
    /// `[filled, next slot]`.
    state: CudaSlice<u32>,
    /// The step's amax so far, as f32 bits.
    pending: CudaSlice<u32>,
    /// The scale to quantize with (a one-element buffer the quantize kernels read).
    pub scale: CudaSlice<f32>,
    len: usize,
    algo: AmaxAlgo,
    margin: i32,
    format: Format,
}

impl DeviceDelayed {
    /// The step's amax so far (f32 bits), which the next update pushes.
    pub fn pending_mut(&mut self) -> &mut CudaSlice<u32> {
        &mut self.pending
    }
}

impl Gpu {
    fn delayed_kernels(&self) -> Result<&DelayedKernels> {
        if let Some(k) = self.delayed.get() {
            return Ok(k);
        }
        let m = self.ctx.load_module(nvrtc::compile(
            "delayed",
            crate::kernel_source("delayed")?,
            self.arch,
        )?)?;
        let k = DelayedKernels {
            record: m.load_function("delayed_record")?,
            update: m.load_function("delayed_update")?,
        };
        Ok(self.delayed.get_or_init(|| k))
    }

    /// A fresh state (scale 1, empty history), as `DelayedState::new`.
    pub fn delayed_state(
        &self,
        history_len: usize,
        algo: AmaxAlgo,
        margin: i32,
        format: Format,
    ) -> Result<DeviceDelayed> {
        if history_len == 0 || history_len > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "amax history of {history_len} entries"
            )));
        }
        Ok(DeviceDelayed {
            history: self.alloc_zeros(history_len, "amax history")?,
            state: self.alloc_zeros(2, "history state")?,
            pending: self.alloc_zeros(1, "pending amax")?,
            scale: self.upload(&[1f32])?,
            len: history_len,
            algo,
            margin,
            format,
        })
    }

    /// Fold the amax of the last quantize (`amax_bits`, one element) into the step's amax.
    pub fn delayed_record(&self, st: &mut DeviceDelayed, amax_bits: &CudaSlice<u32>) -> Result<()> {
        let k = self.delayed_kernels()?;
        // SAFETY: two one-element buffers, as the kernel reads and writes.
        unsafe {
            self.stream
                .launch_builder(&k.record)
                .arg(&mut st.pending)
                .arg(amax_bits)
                .launch(LaunchConfig::for_num_elems(1))?;
        }
        Ok(())
    }

    /// End of step: push the step's amax into the history and set the next scale.
    pub fn delayed_update(&self, st: &mut DeviceDelayed) -> Result<()> {
        let k = self.delayed_kernels()?;
        let (h, most_recent, margin) = (
            st.len as i32,
            i32::from(st.algo == AmaxAlgo::MostRecent),
            st.margin,
        );
        let fmax = st.format.max();
        // SAFETY: buffers of the lengths the kernel indexes (history H, state 2, one-element pending/scale).
        unsafe {
            self.stream
                .launch_builder(&k.update)
                .arg(&mut st.history)
                .arg(&mut st.state)
                .arg(&mut st.pending)
                .arg(&mut st.scale)
                .arg(&h)
                .arg(&most_recent)
                .arg(&margin)
                .arg(&fmax)
                .launch(LaunchConfig::for_num_elems(1))?;
        }
        Ok(())
    }

    /// The state on the host, as the CPU's `DelayedState` (history oldest
    /// first): what a checkpoint stores, so that a resumed run (on either
    /// device) continues with the same histories and scales.
    pub fn delayed_export(&self, st: &DeviceDelayed) -> Result<DelayedState> {
        let hist = self.download(&st.history)?;
        let state = self.download(&st.state)?;
        let pending = f32::from_bits(self.download(&st.pending)?[0]);
        let scale = self.download(&st.scale)?[0];
        let (filled, next) = (state[0] as usize, state[1] as usize);
        if filled > st.len || next >= st.len {
            return Err(Error::Shape(format!(
                "delayed state on the device is corrupt: {filled} filled, next slot {next} of {}",
                st.len
            )));
        }
        // Until the ring is full the entries are slots 0..filled in order;
        // after that the oldest is the next slot to be overwritten.
        let oldest_first: Vec<f32> = if filled < st.len {
            hist[..filled].to_vec()
        } else {
            hist[next..].iter().chain(&hist[..next]).copied().collect()
        };
        Ok(DelayedState::restore(
            (st.len, st.algo, st.margin, st.format),
            &oldest_first,
            scale,
            pending,
        ))
    }

    /// Load a host state (from [`Gpu::delayed_export`] or the CPU) into `st`,
    /// whose history length, algorithm, margin and format must match.
    pub fn delayed_import(&self, st: &mut DeviceDelayed, s: &DelayedState) -> Result<()> {
        let want = (st.len, st.algo, st.margin, st.format);
        if s.config() != want {
            return Err(Error::Shape(format!(
                "delayed-scaling state {:?} does not match this layer's {want:?} (history length, algorithm, margin, format)",
                s.config()
            )));
        }
        let h: Vec<f32> = s.history().collect();
        if h.len() > st.len {
            return Err(Error::Shape(format!(
                "delayed-scaling state with {} history entries for a history of {}",
                h.len(),
                st.len
            )));
        }
        let mut hist = vec![0f32; st.len];
        hist[..h.len()].copy_from_slice(&h);
        self.stream.memcpy_htod(&hist, &mut st.history)?;
        let n = h.len() as u32;
        self.stream
            .memcpy_htod(&[n, n % st.len as u32], &mut st.state)?;
        self.stream
            .memcpy_htod(&[s.pending().to_bits()], &mut st.pending)?;
        self.stream.memcpy_htod(&[s.scale()], &mut st.scale)?;
        Ok(())
    }
}
