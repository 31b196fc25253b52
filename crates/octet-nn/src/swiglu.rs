//! SwiGLU activation: `out = silu(gate) * up`, `silu(g) = g * sigmoid(g)`.

use crate::{Error, Result};
use octet_tensor::cpu::Real;
use octet_tensor::{alloc_capacity, alloc_collect, DType, Tensor};

/// What [`swiglu_backward`] reads: both inputs.
#[derive(Clone, Debug)]
pub struct SwigluSaved {
    gate: Tensor, // (M, F)
    up: Tensor,   // (M, F)
}

impl SwigluSaved {
    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.gate.bytes() + self.up.bytes()
    }
}

fn sigmoid<T: Real>(g: T) -> T {
    T::one() / (T::one() + (-g).exp())
}

/// `out (M, F) = silu(gate) * up`, in `gate`'s dtype.
pub fn swiglu_forward(gate: &Tensor, up: &Tensor) -> Result<(Tensor, SwigluSaved)> {
    if gate.shape() != up.shape() || gate.numel() == 0 {
        return Err(Error::Shape(format!(
            "swiglu: gate {:?} vs up {:?}",
            gate.shape(),
            up.shape()
        )));
    }
    fn run<T: Real>(g: &[T], u: &[T]) -> octet_tensor::Result<Vec<T>> {
        let what = format_args!("a SwiGLU output of {} elements", g.len());
        alloc_collect(g.iter().zip(u).map(|(&g, &u)| g * sigmoid(g) * u), what)
    }
    let s = gate.shape();
    let out = match gate.dtype() {
        DType::F64 => Tensor::from_f64(s, run(&gate.try_to_f64_vec()?, &up.try_to_f64_vec()?)?)?,
        dt => Tensor::from_f32_as(s, run(&gate.f32_values()?, &up.f32_values()?)?, dt)?,
    };
    Ok((
        out,
        SwigluSaved {
            gate: gate.try_clone()?,
            up: up.try_clone()?,
        },
    ))
}

/// `(d_gate, d_up)`: `d_up = dy silu(g)`, `d_gate = dy u sigmoid(g) (1 + g (1 - sigmoid(g)))`.
pub fn swiglu_backward(saved: SwigluSaved, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let SwigluSaved { gate, up } = saved;
    if dy.shape() != gate.shape() {
        return Err(Error::Shape(format!(
            "swiglu grad {:?} vs input {:?}",
            dy.shape(),
            gate.shape()
        )));
    }
    fn run<T: Real>(g: &[T], u: &[T], dy: &[T]) -> octet_tensor::Result<(Vec<T>, Vec<T>)> {
        let what = format_args!("a SwiGLU input gradient of {} elements", g.len());
        let mut dg = alloc_capacity(g.len(), what)?;
        let mut du = alloc_capacity(g.len(), what)?;
        for ((&g, &u), &d) in g.iter().zip(u).zip(dy) {
            let s = sigmoid(g);
            du.push(d * g * s);
            dg.push(d * u * s * (T::one() + g * (T::one() - s)));
        }
        Ok((dg, du))
    }
    let shape = gate.shape();
    match gate.dtype() {
        DType::F64 => {
            let (dg, du) = run(
                &gate.try_to_f64_vec()?,
                &up.try_to_f64_vec()?,
                &dy.try_to_f64_vec()?,
            )?;
            Ok((Tensor::from_f64(shape, dg)?, Tensor::from_f64(shape, du)?))
        }
        dt => {
            let (dg, du) = run(&gate.f32_values()?, &up.f32_values()?, &dy.f32_values()?)?;
            Ok((
                Tensor::from_f32_as(shape, dg, dt)?,
                Tensor::from_f32_as(shape, du, dt)?,
            ))
        }
    }
}
