class StoreFormatError(ValueError): pass
class PackedStore: pass
