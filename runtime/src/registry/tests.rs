//! The registry's unit tests.

mod basics {
    use crate::mock::{Mock, MockTensor};
    use crate::registry::*;

    #[test]
    fn mock_is_registered_and_unknown_names_are_refused() {
        let mock = find("mock").unwrap();
        assert_eq!((mock.can_export(), mock.can_import()), (true, true));
        assert!(mock.supports_device(Device::Mock(3)) && !mock.supports_device(Device::Host));
        let err = find("torchh").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(&err, RegistryError::UnknownAdapter { name, .. } if name == "torchh"), "{msg}");
        assert!(msg.contains("mock"), "{msg}");
    }

    #[test]
    fn wrong_types_and_devices_are_refused_before_any_work() {
        let m = Mock::new();
        let s = m.stream(0, "s");
        let err = convert(Box::new(5u32), "mock", "mock", &s).unwrap_err();
        assert!(matches!(err.error, RegistryError::WrongType { adapter: "mock", .. }), "{err}");
        let x = m.tensor_f32(&s, "x", &[1], &[1.0]);
        let y = convert(Box::new(x), "mock", "mock", &s).unwrap();
        assert!(y.downcast::<MockTensor>().is_ok());
    }
}

mod refusals {
    use crate::mock::{Mock, MockTensor};
    use crate::registry::submit;
    use crate::registry::*;

    submit! {
        Adapter::new("unit-twice", "1.0.0").devices(&[DeviceKind::Mock]).dtypes(dtype::ALL).exports::<MockTensor>()
    }
    submit! {
        Adapter::new("unit-twice", "2.0.0").devices(&[DeviceKind::Mock]).dtypes(dtype::ALL).imports::<MockTensor>()
    }

    submit! {
        Adapter::new("unit-host", "1.0.0").devices(&[DeviceKind::Host]).dtypes(dtype::ALL).imports::<MockTensor>()
    }
    submit! {
        Adapter::new("unit-f64", "1.0.0").devices(&[DeviceKind::Mock]).dtypes(&[DataType::F64]).imports::<MockTensor>()
    }

    #[test]
    fn a_name_registered_twice_is_refused_naming_both() {
        let err = find("unit-twice").unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(&err, RegistryError::Ambiguous { name, versions, .. }
                if name == "unit-twice" && versions == &["1.0.0", "2.0.0"]),
            "{msg}"
        );
        assert!(
            msg.contains("unit-twice 1.0.0 exporting `handoff_runtime::mock::tensor::MockTensor`"),
            "{msg}"
        );
        assert!(msg.contains("2.0.0 exporting nothing and importing"), "{msg}");
        // Both are still listed (for `handoff doctor`).
        assert_eq!(list().iter().filter(|a| a.name == "unit-twice").count(), 2);
    }

    /// Every refusal before the export gives the value back, untouched.
    #[test]
    fn a_refused_convert_gives_the_value_back() {
        let m = Mock::new();
        let s = m.stream(0, "s");
        type Case<'a> = (&'a str, &'a str, &'a dyn Any, fn(&RegistryError) -> bool);
        let cases: [Case<'_>; 5] = [
            ("mock", "nope", &s, |e| matches!(e, RegistryError::UnknownAdapter { .. })),
            ("unit-twice", "mock", &s, |e| matches!(e, RegistryError::Ambiguous { .. })),
            ("mock", "mock", &5u32, |e| matches!(e, RegistryError::WrongContext { adapter: "mock", .. })),
            ("mock", "unit-host", &s, |e| {
                matches!(e, RegistryError::UnsupportedDevice { adapter: "unit-host", .. })
            }),
            ("mock", "unit-f64", &s, |e| {
                matches!(e, RegistryError::UnsupportedDtype { adapter: "unit-f64", .. })
            }),
        ];
        for (from, to, ctx, expected) in cases {
            let x = m.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
            let (buffer, ptr) = (x.buffer(), x.data_ptr());
            let (err, delta) =
                crate::stats::measure(|| convert_into(Box::new(x), from, to, ctx).unwrap_err());
            assert!(expected(&err.error), "{from} -> {to}: {err}");
            assert_eq!(delta.exports, 0, "{from} -> {to}: refused before any export");
            let back: Box<MockTensor> = err.into_value().expect("given back").downcast().unwrap();
            assert_eq!((back.buffer(), back.data_ptr()), (buffer, ptr));
            drop(back);
            m.synchronize();
            assert!(m.is_released(buffer));
        }
        let err = convert(Box::new(5u32), "mock", "mock", &s).unwrap_err();
        assert_eq!(*err.into_value().unwrap().downcast::<u32>().unwrap(), 5);
        // Once exported, the value is gone: a mock tensor does not import on the host.
        let x = m.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
        let (err, delta) =
            crate::stats::measure(|| convert(Box::new(x), "mock", "mock", &Stream::host()).unwrap_err());
        assert!(matches!(err.error, RegistryError::Failed { adapter: "mock", step: "import", .. }), "{err}");
        assert_eq!(delta.exports, 1);
        assert!(!err.has_value());
    }

    #[test]
    fn adapter_export_gives_a_refused_value_back() {
        let err = find("mock").unwrap().export(Box::new("text"), &Stream::host()).unwrap_err();
        assert!(matches!(err.error, RegistryError::WrongType { adapter: "mock", .. }), "{err}");
        let mut err = err;
        assert!(err.has_value());
        assert_eq!(*err.take_value().unwrap().downcast::<&str>().unwrap(), "text");
        assert!(!err.has_value());
        // The error converts into a plain `RegistryError` and a boxed `Send + Sync` error.
        let boxed: Box<dyn std::error::Error + Send + Sync> = err.into();
        assert!(boxed.to_string().contains("adapter `mock` exports"), "{boxed}");
    }

    /// The mock adapter advertises every dtype: its import takes every one.
    #[test]
    fn the_mock_imports_every_dtype_it_advertises() {
        struct Retyped(MockTensor, DataType);
        impl crate::StreamOrdered for Retyped {
            fn device(&self) -> Device {
                crate::StreamOrdered::device(&self.0)
            }
            fn stream(&self) -> Option<Stream> {
                Some(self.0.stream().clone())
            }
        }
        impl Export for Retyped {
            fn describe(&self) -> Result<crate::TensorDesc<'_>> {
                Ok(crate::TensorDesc::new(
                    self.0.data_ptr().cast(),
                    crate::StreamOrdered::device(&self.0),
                    self.1,
                    &[1i64][..],
                ))
            }
        }
        let m = Mock::new();
        let s = m.stream(0, "s");
        let mock = find("mock").unwrap();
        let entry = mock.import.unwrap();
        for &dtype in mock.dtypes {
            let h = Retyped(m.tensor_f32(&s, "x", &[4], &[0.0; 4]), dtype).export(&s).unwrap();
            let t = (entry.import)(h, &s).unwrap_or_else(|e| panic!("{}: {e}", dtype::name(dtype)));
            assert!(t.is::<MockTensor>());
        }
    }
}
