//! CPU tests, with the PJRT CPU plugin in `HANDOFF_PJRT_PLUGIN` (the xtask fetches
//! and sets it). They are never skipped when the plugin exists.

mod common;

use common::*;
use handoff_runtime::dtype::DataType;
use handoff_runtime::{Device, Export, Handoff, Ready, Release, Stream, TensorDesc, reaper, stats};
use handoff_xla::{Client, ClientOptions, CompileOptions, Plugin, Program, ViewOptions, XlaError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn loads_and_reports_version_and_extensions() {
    let Some(p) = plugin() else { return };
    assert_eq!(p.api_version(), (0, 115));
    assert!(!p.is_gpu(), "the CPU plugin has no stream extension");
    assert!(p.extensions().iter().any(|e| e == "Layouts"), "{:?}", p.extensions());
    let attrs = p.attributes().unwrap();
    assert!(attrs.iter().any(|(k, _)| k.contains("stablehlo")), "{attrs:?}");
    // Loading the same file again gives the same plugin (initialized once).
    let again = Plugin::load(p.path()).unwrap();
    assert!(std::ptr::eq(p, again));
    let c = Client::new(p, &ClientOptions::default()).unwrap();
    assert_eq!(c.platform(), "cpu");
    assert!(!c.devices().is_empty());
    assert_eq!(c.device(0).unwrap().handoff_device(), Device::Host);
}

#[test]
fn missing_plugin_path_is_a_clear_error() {
    let e = Plugin::load("/nonexistent/pjrt_plugin.so").unwrap_err();
    let m = e.to_string();
    assert!(m.contains("/nonexistent/pjrt_plugin.so") && m.contains("No such file"), "{m}");
    let not_a_plugin = Plugin::load("/bin/sh").unwrap_err().to_string();
    assert!(not_a_plugin.contains("/bin/sh"), "{not_a_plugin}");
}

#[test]
fn compiles_text_and_executes_elementwise() {
    let Some(c) = client() else { return };
    let exe = c.compile(&program("gelu_scale_f32_4x8.mlir")).unwrap();
    let params = exe.parameters().expect("parameters from the compiled module");
    assert_eq!(params[0].shape, [4, 8]);
    assert_eq!(params[0].dtype, Some(DataType::F32));
    let xs: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    let x = c.buffer_from_host(&c.device(0).unwrap(), &xs, &[4, 8]).unwrap();
    let y = exe.execute(&[&x]).unwrap();
    let want: Vec<f32> = xs.iter().map(|&v| gelu_scale(v)).collect();
    close(&y[0].to_vec::<f32>().unwrap(), &want, 1e-5);
}

#[test]
fn compiles_bytecode() {
    let Some(c) = client() else { return };
    let p = program("gelu_scale_f32_4x8_cpu.mlirbc");
    assert!(p.is_bytecode());
    let exe = c.compile(&p).unwrap();
    let xs: Vec<f32> = (0..32).map(|i| (i as f32).sin()).collect();
    let x = c.buffer_from_host(&c.device(0).unwrap(), &xs, &[4, 8]).unwrap();
    let y = exe.execute(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
    close(&y, &xs.iter().map(|&v| gelu_scale(v)).collect::<Vec<_>>(), 1e-5);
}

#[test]
fn reduction_matmul_and_multi_output() {
    let Some(c) = client() else { return };
    let d = c.device(0).unwrap();
    let xs: Vec<f32> = (0..128).map(|i| (i % 7) as f32 - 3.0).collect();
    let x = c.buffer_from_host(&d, &xs, &[8, 16]).unwrap();
    let sums = c.compile(&program("row_sum_f32_8x16.mlir")).unwrap().execute(&[&x]).unwrap();
    let want: Vec<f32> = xs.chunks(16).map(|r| r.iter().sum()).collect();
    close(&sums[0].to_vec::<f32>().unwrap(), &want, 1e-6);

    let a: Vec<f32> = (0..16 * 32).map(|i| ((i * 7) % 11) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..32 * 8).map(|i| ((i * 5) % 13) as f32 * 0.5 - 3.0).collect();
    let (ba, bb) =
        (c.buffer_from_host(&d, &a, &[16, 32]).unwrap(), c.buffer_from_host(&d, &b, &[32, 8]).unwrap());
    let m = c.compile(&program("matmul_f32_16x32x8.mlir")).unwrap().execute(&[&ba, &bb]).unwrap();
    let mut want = vec![0f32; 16 * 8];
    for i in 0..16 {
        for j in 0..8 {
            want[i * 8 + j] = (0..32).map(|k| a[i * 32 + k] * b[k * 8 + j]).sum();
        }
    }
    close(&m[0].to_vec::<f32>().unwrap(), &want, 1e-5);

    let v: Vec<f32> = (0..64).map(|i| ((i * 37) % 64) as f32 - 20.0).collect();
    let bv = c.buffer_from_host(&d, &v, &[64]).unwrap();
    let exe = c.compile(&program("sum_and_max_f32_64.mlir")).unwrap();
    assert_eq!(exe.outputs().len(), 3);
    let outs = exe.execute(&[&bv]).unwrap();
    assert_eq!(outs.len(), 3);
    assert_eq!(outs[0].shape(), &[] as &[i64]);
    close(&outs[0].to_vec::<f32>().unwrap(), &[v.iter().sum()], 1e-6);
    close(&outs[1].to_vec::<f32>().unwrap(), &[43.0], 0.0);
    close(&outs[2].to_vec::<f32>().unwrap(), &v.iter().map(|x| x * 2.0).collect::<Vec<_>>(), 0.0);
}

#[test]
fn layernorm_gelu_f32_and_bf16() {
    let Some(c) = client() else { return };
    let d = c.device(0).unwrap();
    let (n, dim) = (64usize, 64usize);
    let x: Vec<f32> = (0..n * dim).map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8).collect();
    let gamma: Vec<f32> = (0..dim).map(|i| 1.0 + i as f32 * 0.01).collect();
    let beta: Vec<f32> = (0..dim).map(|i| i as f32 * -0.005).collect();
    let mut want = vec![0f32; n * dim];
    for r in 0..n {
        let row = &x[r * dim..(r + 1) * dim];
        let mean = row.iter().sum::<f32>() / dim as f32;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / dim as f32;
        for k in 0..dim {
            want[r * dim + k] = gelu((row[k] - mean) / (var + 1e-5).sqrt() * gamma[k] + beta[k]);
        }
    }
    let exe = c.compile(&program("layernorm_gelu_f32_64x64.mlir")).unwrap();
    let bx = c.buffer_from_host(&d, &x, &[64, 64]).unwrap();
    let (bg, bb) =
        (c.buffer_from_host(&d, &gamma, &[64]).unwrap(), c.buffer_from_host(&d, &beta, &[64]).unwrap());
    close(&exe.execute(&[&bx, &bg, &bb]).unwrap()[0].to_vec::<f32>().unwrap(), &want, 1e-4);

    let bf = |v: &[f32]| v.iter().map(|&f| half::bf16::from_f32(f)).collect::<Vec<_>>();
    let exe = c.compile(&program("layernorm_gelu_bf16_64x64.mlir")).unwrap();
    let (x16, g16, b16) = (bf(&x), bf(&gamma), bf(&beta));
    let bx = c.buffer_from_host(&d, &x16, &[64, 64]).unwrap();
    let (bg, bb) =
        (c.buffer_from_host(&d, &g16, &[64]).unwrap(), c.buffer_from_host(&d, &b16, &[64]).unwrap());
    let out: Vec<f32> = exe.execute(&[&bx, &bg, &bb]).unwrap()[0]
        .to_vec::<half::bf16>()
        .unwrap()
        .iter()
        .map(|v| v.to_f32())
        .collect();
    close(&out, &want, 2e-2);
}

#[test]
fn bad_programs_and_wrong_inputs_are_clear_errors() {
    let Some(c) = client() else { return };
    let e = c.compile(&Program::text("module { this is not mlir }")).unwrap_err();
    assert!(e.code().is_some(), "{e}");
    assert!(e.to_string().contains("PJRT_Client_Compile") && e.to_string().contains("this"), "{e}");

    let exe = c.compile(&program("matmul_f32_16x32x8.mlir")).unwrap();
    let d = c.device(0).unwrap();
    let a = c.buffer_from_host(&d, &[0f32; 16 * 32], &[16, 32]).unwrap();
    let wrong_shape = c.buffer_from_host(&d, &[0f32; 32 * 4], &[32, 4]).unwrap();
    let wrong_dtype = c.buffer_from_host(&d, &[0i32; 32 * 8], &[32, 8]).unwrap();
    let e = exe.execute(&[&a, &wrong_shape]).unwrap_err();
    assert!(matches!(e, XlaError::InputMismatch { index: 1, what: "shape", .. }), "{e}");
    assert!(e.to_string().contains("f32[32, 8]") && e.to_string().contains("f32[32, 4]"), "{e}");
    let e = exe.execute(&[&a, &wrong_dtype]).unwrap_err();
    assert!(matches!(e, XlaError::InputMismatch { index: 1, what: "dtype", .. }), "{e}");
    assert!(e.to_string().contains("i32[32, 8]"), "{e}");
    let e = exe.execute(&[&a]).unwrap_err();
    assert!(matches!(e, XlaError::Arity { what: "inputs", expected: 2, got: 1, .. }), "{e}");
    assert!(e.to_string().contains("takes 2 inputs, 1 given"), "{e}");
}

fn host_handoff<K: Send + 'static>(keep: K, ptr: *const f32, shape: &[i64]) -> Handoff {
    let shape = shape.to_vec();
    Handoff::with_keep_alive(
        keep,
        move |_| Ok(TensorDesc::new(ptr as *mut _, Device::Host, DataType::F32, shape)),
        &Stream::host(),
        Ready::Elided,
        Release::AfterConsumer,
    )
    .unwrap()
}

struct Flag(Arc<AtomicBool>);
impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn host_view_is_zero_copy_and_writes_are_seen() {
    let Some(c) = client() else { return };
    let exe = c.compile(&program("gelu_scale_f32_4x8.mlir")).unwrap();
    let mut block = Box::new(Aligned::<32>([1.0; 32]));
    let ptr = block.0.as_mut_ptr();
    let released = Arc::new(AtomicBool::new(false));
    let watched = ViewOptions::default().watched();
    let (x, d) = stats::measure(|| {
        c.import_with(host_handoff(Flag(released.clone()), ptr, &[4, 8]), watched).unwrap()
    });
    assert_eq!((d.copies, d.host_syncs), (0, 0));
    assert!(!x.is_copied());
    assert_eq!(x.device_pointer().unwrap() as *mut f32, ptr, "the view aliases the memory");
    let y1 = exe.execute(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
    close(&y1, &[gelu_scale(1.0); 32], 1e-5);
    // A write through the producer's memory is seen by the next execution.
    // SAFETY: (test) no execution is using the memory now.
    unsafe { *ptr.add(5) = -1.5 };
    let y2 = exe.execute(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
    assert!((y2[5] - gelu_scale(-1.5)).abs() < 1e-5);
    let watch = x.view_watch().unwrap();
    assert!(!watch.is_released());
    drop(x);
    // Idle: on_delete_callback runs inside Buffer_Destroy.
    assert!(watch.is_released());
    assert!(released.load(Ordering::SeqCst));
    drop(block);
}

#[test]
fn on_delete_waits_for_a_running_execution() {
    let Some(c) = client() else { return };
    let exe = c.compile(&program("layernorm_gelu_f32_1024x1024.mlir")).unwrap();
    let d = c.device(0).unwrap();
    let gamma = c.buffer_from_host(&d, &vec![1.0f32; 1024], &[1024]).unwrap();
    let beta = c.buffer_from_host(&d, &vec![0.0f32; 1024], &[1024]).unwrap();
    let mut seen_running = 0;
    for _ in 0..5 {
        let data: Vec<Aligned<1024>> = (0..1024).map(|r| Aligned([(r % 5) as f32; 1024])).collect();
        let data = Box::new(data);
        let ptr = data.as_ptr() as *const f32;
        let released = Arc::new(AtomicBool::new(false));
        let h = host_handoff((data, Flag(released.clone())), ptr, &[1024, 1024]);
        let x = c.import_with(h, ViewOptions::default().watched()).unwrap();
        let watch = x.view_watch().unwrap();
        let out = exe.execute(&[&x, &gamma, &beta]).unwrap().remove(0);
        let running = !out.is_ready().unwrap();
        drop(x);
        // Released, then still running: on_delete did not wait. (Released while the
        // output is ready says nothing: the execution may have ended during the drop.)
        let released_now = watch.is_released();
        if released_now && !out.is_ready().unwrap() {
            panic!("on_delete ran while the execution using the view was still running");
        }
        if running && !released_now {
            seen_running += 1;
        }
        let y = out.to_vec::<f32>().unwrap();
        assert!(y.iter().all(|v| v.is_finite()));
        assert!(y[0].abs() < 1e-3, "row of equal values normalizes to 0: {}", y[0]);
        // After the execution, the callback has run (on an XLA thread), and the memory
        // went back: given back to this thread, which releases nothing here, so the
        // reaper's thread drops it once it waited `reaper::STALE`.
        for _ in 0..1000 {
            if watch.is_released() && released.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(watch.is_released() && released.load(Ordering::SeqCst));
    }
    println!("executions still running at the drop: {seen_running}/5");
}

#[test]
fn unaligned_host_memory_is_refused_unless_a_copy_is_asked() {
    let Some(c) = client() else { return };
    let block = Box::new(Aligned::<40>([2.0; 40]));
    let ptr = block.0[1..].as_ptr(); // 4 bytes past a 64-byte boundary
    let e = c.import(host_handoff((), ptr, &[4, 8])).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("64-byte aligned") && m.contains("allow_copy"), "{m}");
    let (x, d) = stats::measure(|| {
        c.import_with(host_handoff((), ptr, &[4, 8]), ViewOptions::default().allow_copy()).unwrap()
    });
    assert_eq!((d.copies, d.bytes_copied), (1, 128));
    assert!(x.is_copied());
    let exe = c.compile(&program("gelu_scale_f32_4x8.mlir")).unwrap();
    close(&exe.execute(&[&x]).unwrap()[0].to_vec::<f32>().unwrap(), &[gelu_scale(2.0); 32], 1e-5);
    let h = x.clone().export(&Stream::host()).unwrap();
    assert!(!h.is_copied(), "the copy is the buffer's, shared with every export: not IS_COPIED");
    drop(block);
}

#[test]
fn exported_buffer_is_readable_and_aliases_pjrt_memory() {
    let Some(c) = client() else { return };
    let d = c.device(0).unwrap();
    let xs: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let x = c.buffer_from_host(&d, &xs, &[4, 8]).unwrap();
    let y = c.compile(&program("gelu_scale_f32_4x8.mlir")).unwrap().execute(&[&x]).unwrap().remove(0);
    let (h, s) = stats::measure(|| y.clone().export(&Stream::host()).unwrap());
    assert!(matches!(h.ready(), Ready::Elided | Ready::HostSynced));
    assert!(s.host_syncs <= 1);
    assert_eq!(h.data_ptr() as *mut std::ffi::c_void, y.device_pointer().unwrap());
    assert_eq!((h.device(), h.dtype(), h.shape()), (Device::Host, DataType::F32, &[4i64, 8][..]));
    // SAFETY: (test) a validated host hand-off of 32 f32.
    let seen = unsafe { std::slice::from_raw_parts(h.data_ptr() as *const f32, 32) }.to_vec();
    close(&seen, &xs.iter().map(|&v| gelu_scale(v)).collect::<Vec<_>>(), 1e-5);
    // Dropping the producer's buffer keeps the memory: the hand-off holds it.
    drop(y);
    // SAFETY: (test) as above; still alive through the hand-off's keep-alive.
    let again = unsafe { std::slice::from_raw_parts(h.data_ptr() as *const f32, 32) }.to_vec();
    assert_eq!(seen, again);
    drop(h);
    reaper::flush();
    // Round trip: an exported buffer imports back as a view of the same memory.
    let z = c.buffer_from_host(&d, &xs, &[4, 8]).unwrap();
    let ptr = z.device_pointer().unwrap();
    let back = c.import(z.export(&Stream::host()).unwrap()).unwrap();
    assert_eq!(back.device_pointer().unwrap(), ptr);
    assert_eq!(back.to_vec::<f32>().unwrap(), xs);
}

#[test]
fn four_threads_execute_concurrently() {
    let Some(c) = client() else { return };
    let exe = Arc::new(c.compile(&program("gelu_scale_f32_1024.mlir")).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (c, exe) = (c.clone(), exe.clone());
            std::thread::spawn(move || {
                let d = c.device(0).unwrap();
                for i in 0..20 {
                    let xs: Vec<f32> =
                        (0..1024).map(|k| ((k + i * 31 + t * 7) % 97) as f32 / 24.0 - 2.0).collect();
                    let x = c.buffer_from_host(&d, &xs, &[1024]).unwrap();
                    let y = exe.execute(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
                    close(&y, &xs.iter().map(|&v| gelu_scale(v)).collect::<Vec<_>>(), 1e-5);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn compiles_for_another_device() {
    let Some(c) = client() else { return };
    if c.devices().len() < 2 {
        println!("SKIPPED: one CPU device");
        return;
    }
    let exe =
        c.compile_with(&program("gelu_scale_f32_4x8.mlir"), &CompileOptions { device: Some(1) }).unwrap();
    let d1 = c.device(1).unwrap();
    let x = c.buffer_from_host(&d1, &[0.25f32; 32], &[4, 8]).unwrap();
    let y = exe.execute(&[&x]).unwrap().remove(0);
    assert_eq!(y.device(), d1);
    close(&y.to_vec::<f32>().unwrap(), &[gelu_scale(0.25); 32], 1e-5);
}
