//! The `jax.export` schema (`serialization.fbs`), as `flatc --rust` would generate it
//! (only what is needed: accessors for the fields read, verification of every field).

use flatbuffers::{Follow, ForwardsUOffset, InvalidFlatbuffer, Table, Vector, Verifiable, Verifier};

/// Declares a table: its struct, its `Follow` impl, one accessor per `read` field
/// (returning `None` where the field is absent) and a `Verifiable` impl visiting
/// every field, `read` and `verified` alike. Each field is `name: vtable slot => type`,
/// the slot being `4 + 2 * (field index in the schema)`.
macro_rules! table {
    (
        $(#[$doc:meta])*
        $name:ident {
            read { $($field:ident: $slot:literal => $ty:ty,)* }
            verified { $($vfield:ident: $vslot:literal => $vty:ty,)* }
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub(super) struct $name<'a> {
            #[allow(dead_code, reason = "tables only verified (`read {}`) have no accessor")]
            tab: Table<'a>,
        }

        impl<'a> Follow<'a> for $name<'a> {
            type Inner = $name<'a>;
            unsafe fn follow(buf: &'a [u8], loc: usize) -> Self::Inner {
                // SAFETY: `Follow::follow`'s contract: the caller guarantees that a
                // table of this type starts at `loc` in `buf` (its soffset to a valid
                // vtable); every caller here follows offsets the verifier checked.
                $name { tab: unsafe { Table::new(buf, loc) } }
            }
        }

        impl<'a> $name<'a> {
            $(
                pub(super) fn $field(&self) -> Option<<$ty as Follow<'a>>::Inner> {
                    // SAFETY: a `$name` is only made by following a verified offset
                    // (from `flatbuffers::root`), and its `Verifiable` impl below,
                    // generated from this same field list, checked that this slot, if
                    // present, holds a valid `$ty` inside the buffer.
                    unsafe { self.tab.get::<$ty>($slot, None) }
                }
            )*
        }

        impl<'a> Verifiable for $name<'a> {
            fn run_verifier(v: &mut Verifier, pos: usize) -> Result<(), InvalidFlatbuffer> {
                v.visit_table(pos)?
                    $(.visit_field::<$ty>(stringify!($field), $slot, false)?)*
                    $(.visit_field::<$vty>(stringify!($vfield), $vslot, false)?)*
                    .finish();
                Ok(())
            }
        }
    };
}

/// A string field.
type Str<'a> = ForwardsUOffset<&'a str>;
/// A vector field of scalars or strings.
type Array<'a, T> = ForwardsUOffset<Vector<'a, T>>;
/// A vector field of tables.
type Tables<'a, T> = ForwardsUOffset<Vector<'a, ForwardsUOffset<T>>>;

table! {
    /// `table PyTreeDef` (verified only).
    PyTreeDef {
        read {}
        verified {
            kind: 4 => i8,
            children: 6 => Tables<'a, PyTreeDef<'a>>,
            children_names: 8 => Array<'a, Str<'a>>,
            custom_name: 10 => Str<'a>,
            custom_auxdata: 12 => Array<'a, i8>,
        }
    }
}

table! {
    /// `table AbstractDevice` (verified only).
    AbstractDevice {
        read {}
        verified {
            device_kind: 4 => Str<'a>,
            num_cores: 6 => u32,
            platform: 8 => Str<'a>,
        }
    }
}

table! {
    /// `table AbstractMesh`.
    AbstractMesh {
        read {
            axis_sizes: 4 => Array<'a, u32>,
        }
        verified {
            axis_names: 6 => Array<'a, Str<'a>>,
            axis_types: 8 => Array<'a, i8>,
            abstract_device: 10 => ForwardsUOffset<AbstractDevice<'a>>,
        }
    }
}

table! {
    /// `table PartitionSpecOneAxis` (verified only).
    PartitionSpecOneAxis {
        read {}
        verified {
            axes: 4 => Array<'a, Str<'a>>,
        }
    }
}

table! {
    /// `table PartitionSpec` (verified only).
    PartitionSpec {
        read {}
        verified {
            partitions: 4 => Tables<'a, PartitionSpecOneAxis<'a>>,
            reduced: 6 => Array<'a, Str<'a>>,
            unreduced: 8 => Array<'a, Str<'a>>,
        }
    }
}

table! {
    /// `table NamedSharding`.
    NamedSharding {
        read {
            mesh: 4 => ForwardsUOffset<AbstractMesh<'a>>,
            memory_kind: 8 => Str<'a>,
            abstract_mesh_idx: 10 => u32,
        }
        verified {
            spec: 6 => ForwardsUOffset<PartitionSpec<'a>>,
        }
    }
}

table! {
    /// `table AbstractValue`: `kind` is `AbstractValueKind` (0 shapedArray,
    /// 1 abstractToken), `dtype` is `DType`, `memory_space` is `MemorySpace`
    /// (0 Missing, 1 Device, 2 Host, 3 Any); `shape` holds one string per dimension.
    AbstractValue {
        read {
            kind: 4 => i8,
            shape: 6 => Array<'a, Str<'a>>,
            dtype: 8 => i8,
            memory_space: 10 => i8,
        }
        verified {}
    }
}

table! {
    /// `table Sharding` (before serialization version 10; `kind` is
    /// `ShardingKind`, no longer written).
    Sharding {
        read {
            hlo_sharding_proto: 6 => Array<'a, i8>,
            named_sharding: 8 => ForwardsUOffset<NamedSharding<'a>>,
        }
        verified {
            kind: 4 => i8,
        }
    }
}

table! {
    /// `table Effect` (verified only).
    Effect {
        read {}
        verified {
            type_name: 4 => Str<'a>,
        }
    }
}

table! {
    /// `table DisabledSafetyCheck` (verified only).
    DisabledSafetyCheck {
        read {}
        verified {
            kind: 4 => i8,
            custom_call_target: 6 => Str<'a>,
        }
    }
}

table! {
    /// `table Exported`, the root.
    Exported {
        read {
            serialization_version: 4 => u16,
            function_name: 6 => Str<'a>,
            in_avals: 10 => Tables<'a, AbstractValue<'a>>,
            out_avals: 14 => Tables<'a, AbstractValue<'a>>,
            nr_devices_short: 16 => i16,
            in_shardings: 18 => Tables<'a, Sharding<'a>>,
            out_shardings: 20 => Tables<'a, Sharding<'a>>,
            platforms: 22 => Array<'a, Str<'a>>,
            ordered_effects: 24 => Tables<'a, Effect<'a>>,
            unordered_effects: 26 => Tables<'a, Effect<'a>>,
            mlir_module_serialized: 30 => Array<'a, u8>,
            calling_convention_version: 32 => u16,
            module_kept_var_idx: 34 => Array<'a, u16>,
            nr_devices: 40 => u32,
            unique_avals: 42 => Tables<'a, AbstractValue<'a>>,
            unique_abstract_meshes: 44 => Tables<'a, AbstractMesh<'a>>,
            unique_named_shardings: 46 => Tables<'a, NamedSharding<'a>>,
            in_avals_idxs: 48 => Array<'a, u32>,
            out_avals_idxs: 50 => Array<'a, u32>,
            in_shardings_idxs: 52 => Array<'a, u32>,
            out_shardings_idxs: 54 => Array<'a, u32>,
            jax_version: 56 => Str<'a>,
            // The VJP (`serialize(vjp_order=k)`, k > 0): an `Exported` of its own,
            // verified recursively (depth bounded by the verifier's `max_depth`).
            vjp: 38 => ForwardsUOffset<Exported<'a>>,
        }
        verified {
            in_tree: 8 => ForwardsUOffset<PyTreeDef<'a>>,
            out_tree: 12 => ForwardsUOffset<PyTreeDef<'a>>,
            disabled_checks: 28 => Tables<'a, DisabledSafetyCheck<'a>>,
            uses_global_constants: 36 => bool,
        }
    }
}
