//! The README's example: a recipe, a quantized tensor, a Linear forward and backward.

use octet_fp8::{BackwardMode, Layout, Recipe, Role, Usage};
use octet_nn::Linear;
use octet_tensor::{cpu, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Current per-tensor scaling, E4M3 forward / E5M2 gradients, FP8 backward.
    let recipe = Recipe::from_name("tensorwise")?.with_backward(BackwardMode::Quantized)?;
    println!("{recipe}"); // i:cur_ten_e4m3,w:cur_ten_e4m3,go:cur_ten_e5m2,bwd:quantized

    let (m, k, n) = (64, 256, 128);
    let data = |len: usize, s: f32| {
        (0..len)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * s)
            .collect()
    };
    let x = Tensor::from_f32(&[m, k], data(m * k, 2.0))?;

    // Quantize: row-wise copy for the forward GEMM, column-wise for the backward.
    let spec = recipe.spec(Role::Input, Layout::Rowwise, None, 0)?;
    let q = cpu::quantize(&x, &spec, &spec, Usage::BOTH, None)?;
    println!("amax {} -> {} bytes of FP8 + scales", q.amax, q.bytes());

    // A trainable FP8 linear layer: forward keeps only what backward needs.
    let mut layer = Linear::new(
        Tensor::from_f32(&[n, k], data(n * k, 0.1))?,
        None,
        Some(recipe),
        true,
    )?;
    let (y, saved) = layer.forward(&x, true)?;
    println!(
        "y {:?}, saved for backward: {} bytes",
        y.shape(),
        saved.bytes()
    );
    let grads = layer.backward(saved, &Tensor::from_f32(&[m, n], data(m * n, 0.01))?)?;
    println!(
        "d_input {:?}, d_weight {:?}",
        grads.d_input.map(|t| t.shape().to_vec()),
        grads.d_weight.map(|t| t.shape().to_vec())
    );
    Ok(())
}
