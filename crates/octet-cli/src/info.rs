//! `octet info`: version, formats, recipes and devices.

use crate::util::Table;
use octet_fp8::{BackwardMode, Format, Recipe};

pub fn run() -> anyhow::Result<()> {
    println!(
        "octet {} ({})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    println!("\nformats");
    let mut t = Table::new(&["format", "bits", "max", "min normal", "min subnormal"]);
    for f in Format::ALL {
        t.row(vec![
            f.name().into(),
            f.bits().to_string(),
            format!("{:e}", f.max()),
            format!("{:e}", f.min_normal()),
            format!("{:e}", f.min_subnormal()),
        ]);
    }
    t.print();
    println!("\nrecipes (the CPU emulates every one exactly: the reference)");
    let mut t = Table::new(&[
        "recipe",
        "roles (default formats)",
        "cuda",
        "backward modes",
    ])
    .text();
    let mut notes = Vec::new();
    for name in Recipe::NAMES {
        let r = Recipe::from_name(name)?;
        let modes: Vec<&str> = BackwardMode::ALL
            .into_iter()
            .filter(|&m| r.with_backward(m).is_ok())
            .map(|m| m.name())
            .collect();
        let (cuda, how) = crate::gpu::recipe_support(name);
        // The roles without the backward mode, which has its own column.
        let roles = r.to_string();
        let roles = roles.split(",bwd:").next().unwrap_or_default().to_string();
        t.row(vec![name.into(), roles, cuda.into(), modes.join(", ")]);
        notes.push(format!("  {name}: {how}"));
    }
    t.print();
    println!("\non the GPU:");
    for n in notes {
        println!("{n}");
    }
    println!("\ndevices");
    println!(
        "  cpu: {} threads (reference backend)",
        rayon::current_num_threads()
    );
    println!("  {}", crate::gpu::describe());
    println!(
        "\ntraining on the GPU (octet train --device cuda): every recipe above that runs there, \
         tensor-core attention for head dims 16/32/64/128 (f32 kernels otherwise); \
         blockwise needs every width and the token count multiples of 16; \
         LoRA (octet lora --device cuda) and sharded data parallel (--nproc) run there too"
    );
    Ok(())
}
