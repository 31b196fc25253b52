//! Kernel launches as programmatic dependents of the previous kernel in the
//! stream (`cuLaunchKernelEx` with the programmatic-serialization
//! attribute): cudarc's launch builder takes no launch attributes.

use crate::Result;
use cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, SyncOnDrop};

// `Dep` passes 32-bit arguments as the low half of a u64.
const _: () = assert!(cfg!(target_endian = "little"));

/// The arguments of one kernel launch, by value, for a launch that (on
/// sm_90 and later) may start while the previous kernel in the stream is
/// still running. The kernel must call `grid_wait` (common.cuh) before it
/// touches memory that kernel writes: the decode kernels do so first thing,
/// the small-M product after copying its constant weight codes. A previous
/// kernel that triggers its dependents early (the small-M product does, once
/// all its blocks run) hides the launch latency of the next.
pub struct Dep<'a> {
    stream: &'a CudaStream,
    vals: Vec<u64>,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Dep<'a> {
    /// No arguments yet, for a launch on `stream`.
    pub fn new(stream: &'a CudaStream) -> Dep<'a> {
        Dep {
            stream,
            vals: Vec::with_capacity(12),
            guards: Vec::with_capacity(8),
        }
    }

    /// A buffer the kernel reads.
    pub fn ptr<T>(&mut self, buf: &'a impl DevicePtr<T>) -> &mut Self {
        let (p, g) = buf.device_ptr(self.stream);
        self.vals.push(p);
        self.guards.push(g);
        self
    }

    /// A buffer the kernel writes.
    pub fn ptr_mut<T>(&mut self, buf: &'a mut impl DevicePtrMut<T>) -> &mut Self {
        let (p, g) = buf.device_ptr_mut(self.stream);
        self.vals.push(p);
        self.guards.push(g);
        self
    }

    /// A 32-bit integer argument.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.vals.push(u64::from(v as u32));
        self
    }

    /// An f32 argument.
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.vals.push(u64::from(v.to_bits()));
        self
    }

    /// Launch `f` with these arguments, as a programmatic dependent when `pdl`.
    ///
    /// # Safety
    /// The arguments must be `f`'s, in order and of its parameter types, and
    /// `cfg` a shape under which `f` stays inside its buffers.
    pub unsafe fn launch(mut self, f: &CudaFunction, cfg: LaunchConfig, pdl: bool) -> Result<()> {
        use cudarc::driver::sys;
        use std::ffi::c_void;
        let mut params: Vec<*mut c_void> = self
            .vals
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: an all-zero launch attribute is valid (id "ignore").
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let c = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(pdl),
        };
        self.stream.context().bind_to_thread()?;
        // SAFETY: `params` points at one value per kernel parameter (the
        // caller's contract), alive until the call returns (the driver copies them).
        unsafe {
            sys::cuLaunchKernelEx(
                &c,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
        Ok(())
    }
}
