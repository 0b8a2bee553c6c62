//! Hand-written schemas for the request bodies whose Rust shape is looser than the wire
//! contract: one struct of optional fields on the Rust side (so the server can name the
//! field at fault in its own words), a tagged union in the document (so a client, or a
//! fuzzer, knows which fields each variant requires).

use std::borrow::Cow;

use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, Discriminator, ObjectBuilder, OneOfBuilder, Schema,
    SchemaType, Type,
};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

/// Text PostgreSQL can store: no NUL character. Every string the API takes refuses NUL.
pub const NO_NUL: &str = "^[^\\u0000]*$";
/// An absolute path on a Unix host, without NUL.
pub const ABSOLUTE_PATH: &str = "^/[^\\u0000]*$";
/// Text with something other than white space in it, and no NUL.
pub const NOT_BLANK: &str = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$";

/// A string field: `nullable` when the server reads `null` as absent.
pub fn string(nullable: bool, pattern: &str, max_length: Option<usize>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(of(Type::String, nullable))
        .pattern(Some(pattern))
        .max_length(max_length)
}

pub fn integer(nullable: bool, minimum: i64, maximum: i64) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(of(Type::Integer, nullable))
        .minimum(Some(minimum))
        .maximum(Some(maximum))
}

pub fn boolean(nullable: bool) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(of(Type::Boolean, nullable))
}

/// One of `values`, or null when `nullable`.
pub fn one_of_strings(nullable: bool, values: &[&str]) -> ObjectBuilder {
    let values = values.iter().map(|v| serde_json::Value::from(*v));
    let null = nullable.then_some(serde_json::Value::Null);
    ObjectBuilder::new()
        .schema_type(of(Type::String, nullable))
        .enum_values(Some(values.chain(null)))
}

/// A list of distinct names, or null.
pub fn names(description: &str) -> RefOr<Schema> {
    ArrayBuilder::new()
        .schema_type(of(Type::Array, true))
        .items(string(false, NOT_BLANK, None))
        .unique_items(true)
        .description(Some(description))
        .into()
}

fn of(kind: Type, nullable: bool) -> SchemaType {
    if nullable {
        SchemaType::from_iter([kind, Type::Null])
    } else {
        SchemaType::new(kind)
    }
}

/// A field of a variant: its name, whether the variant requires it, and its schema.
pub type Field = (&'static str, bool, RefOr<Schema>);

/// One variant of a tagged union: the tag's value, the component it is named as, and its
/// fields beside the tag.
pub struct Variant {
    pub tag: &'static str,
    pub name: &'static str,
    pub description: &'static str,
    pub fields: Vec<Field>,
}

/// A closed object per variant (unknown fields are refused), registered as components,
/// and a `oneOf` over them with a discriminator on `tag`.
pub fn tagged_union(
    tag: &'static str,
    description: &str,
    variants: Vec<Variant>,
    schemas: &mut Vec<(String, RefOr<Schema>)>,
) -> RefOr<Schema> {
    let mut union = OneOfBuilder::new().description(Some(description));
    let mut discriminator = Discriminator::new(tag);
    for variant in variants {
        let reference = format!("#/components/schemas/{}", variant.name);
        discriminator
            .mapping
            .insert(variant.tag.to_string(), reference.clone());
        let tag_schema = one_of_strings(false, &[variant.tag]);
        let object = variant.fields.into_iter().fold(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(variant.description))
                .property(tag, tag_schema)
                .required(tag)
                .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false))),
            |object, (name, required, schema)| {
                let object = object.property(name, schema);
                if required {
                    object.required(name)
                } else {
                    object
                }
            },
        );
        schemas.push((variant.name.to_string(), object.into()));
        union = union.item(Ref::new(reference));
    }
    union.discriminator(Some(discriminator)).into()
}

/// Largest magnitude a number in free-form JSON may have: 2^53 - 1, the range every JSON
/// reader holds exactly (the server refuses larger ones with 422).
pub const MAX_JSON_NUMBER: i64 = 9_007_199_254_740_991;

/// The schema of free-form JSON a request carries (a media job's `input`, a preset's
/// `compat`): any object. Only a schema; the Rust fields stay `serde_json` values. Its
/// rules on nested values are in its description: JSON Schema states them only by
/// recursion, which mainstream client generators do not follow.
pub struct JsonObject;

impl PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property_names(Some(string(false, NO_NUL, None)))
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(true)))
            .description(Some(
                "Any JSON object whose strings and keys hold no NUL and whose numbers are \
                 within ±(2^53 - 1), the range every JSON reader holds exactly (422 \
                 otherwise).",
            ))
            .into()
    }
}

impl ToSchema for JsonObject {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonObject")
    }
}
