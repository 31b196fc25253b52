//! TMA descriptors (`CUtensorMap`) for the Hopper kernels that copy tiles
//! with the tensor memory accelerator (`cp.async.bulk.tensor`): built on the
//! host per launch by `cuTensorMapEncodeTiled` and passed by value.

use crate::{Error, Result};
use cudarc::driver::sys::{
    cuTensorMapEncodeTiled, CUresult, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};

/// A TMA descriptor, a kernel argument (`const __grid_constant__ TmaMap` in
/// `kernels/common.cuh`).
#[repr(transparent)]
pub struct TmaMap(CUtensorMap);

// SAFETY: a plain 128-byte struct, copied into the kernel's parameter space.
unsafe impl cudarc::driver::DeviceRepr for TmaMap {}

impl TmaMap {
    /// The map of a dense row-major tensor of `elem`-byte elements (1: u8,
    /// 2: bf16) at device address `ptr`, dims innermost first (`dims[0]`
    /// contiguous), copied in boxes of `boxes` elements per dim with the given
    /// swizzle; reads outside the tensor give zeros.
    pub fn new(
        ptr: u64,
        elem: usize,
        dims: &[usize],
        boxes: &[u32],
        swizzle: CUtensorMapSwizzle,
    ) -> Result<TmaMap> {
        let rank = dims.len();
        if !(2..=5).contains(&rank) || boxes.len() != rank {
            return Err(Error::Shape(format!(
                "TMA map of rank {rank} with {} box dims",
                boxes.len()
            )));
        }
        let dtype = match elem {
            1 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            _ => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        };
        let gdims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        // Byte strides of dims 1.. (dim 0 is contiguous).
        let strides: Vec<u64> = (1..rank)
            .map(|i| (dims[..i].iter().product::<usize>() * elem) as u64)
            .collect();
        let unit = vec![1u32; rank];
        let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
        // SAFETY: every pointer argument points at a live local of the length
        // `rank` implies; the driver writes the map and reads nothing else.
        let r = unsafe {
            cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                dtype,
                rank as u32,
                ptr as *mut std::ffi::c_void,
                gdims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                unit.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != CUresult::CUDA_SUCCESS {
            return Err(Error::Driver(format!(
                "cuTensorMapEncodeTiled for a tensor of dims {dims:?} (innermost first), boxes {boxes:?}: {r:?}"
            )));
        }
        // SAFETY: initialised by the successful call above.
        Ok(TmaMap(unsafe { map.assume_init() }))
    }
}
